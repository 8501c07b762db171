"""``spotray render``: the stack's in-cluster objects as files, valid for the stack's Kubernetes version and the
pinned CRDs and charts, stable across runs, and the very objects ``pulumi up`` creates."""

import shutil

import kubernetes_validate
import pytest
import yaml

from cluster.rayjob import job_settings, rayjob
from infra.cli import main
from infra.kernel.config import load_stack_file
from infra.kernel.names import TRAINING_NAMESPACE
from infra.kernel.versions import (
    DCGM_EXPORTER,
    KUBE_PROMETHEUS_STACK,
    KUBERAY_OPERATOR,
    MINIO,
    NVIDIA_DEVICE_PLUGIN,
)
from infra.render import render, stale, write
from monitoring.objects import monitoring_manifests
from spotray.errors import SpotrayError
from tests.cluster.stacks import stack
from tests.repo import REPO, STACKS
from tests.schemas import pinned_chart_values, unknown_values_keys, validate_custom_resource

CRDS = {"RayJob": "kuberay-v1.7.0_ray.io_rayjobs.yaml", "RayCluster": "kuberay-v1.7.0_ray.io_rayclusters.yaml",
        "PodMonitor": "prometheus-operator-v0.93.1_podmonitors.yaml",
        "PrometheusRule": "prometheus-operator-v0.93.1_prometheusrules.yaml"}
# The pinned charts whose values.yaml ../shared holds (DCGM's is not there).
@pytest.fixture(scope="module")
def dev(tmp_path_factory, stack_plans):
    cfg, planned = stack_plans["dev"]
    out = tmp_path_factory.mktemp("render") / "dev"
    write(render(cfg, planned), out)
    return cfg, out


def objects(out):
    return {p.relative_to(out).as_posix(): yaml.safe_load(p.read_text()) for p in sorted((out / "objects").rglob("*"))
            if p.is_file()}


def check_valid(obj, kubernetes_version):
    if obj["kind"] in CRDS:
        validate_custom_resource(obj, CRDS[obj["kind"]])
    else:
        kubernetes_validate.validate(obj, f"{kubernetes_version}.0", strict=True)


def test_every_object_is_valid_for_the_stacks_kubernetes_version(dev):
    cfg, out = dev
    found = objects(out)
    assert {o["kind"] for o in found.values()} >= {"Namespace", "ServiceAccount", "NetworkPolicy"}
    for obj in found.values():
        check_valid(obj, cfg.kubernetes.version)


def test_every_monitoring_object_is_rendered_as_built(dev):
    cfg, out = dev
    found = objects(out)
    for manifest in monitoring_manifests(cfg.monitoring, TRAINING_NAMESPACE):
        meta = manifest["metadata"]
        assert found[f"objects/{meta['namespace']}/{manifest['kind'].lower()}-{meta['name']}.yaml"] == manifest
    kinds = [o["kind"] for o in found.values()]
    assert kinds.count("PodMonitor") == 2 and kinds.count("PrometheusRule") == 1


def test_strict_validation_catches_a_misspelt_field(dev):
    cfg, out = dev
    policy = next(o for o in objects(out).values() if o["kind"] == "NetworkPolicy")
    policy["spec"]["podSelectr"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        check_valid(policy, cfg.kubernetes.version)


def test_one_object_per_file_named_by_namespace_kind_and_name_and_all_in_the_kustomization(dev):
    _, out = dev
    found = objects(out)
    for path, obj in found.items():
        namespace = obj["metadata"].get("namespace", "_cluster")
        assert path == f"objects/{namespace}/{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kustomization["resources"] == sorted(found)


def test_helm_releases_are_their_pinned_chart_and_values_that_exist_in_it(dev):
    _, out = dev
    releases = {p.parent.name: yaml.safe_load(p.read_text()) for p in (out / "helm").glob("*/release.yaml")}
    assert set(releases) == {"kuberay-system-kuberay-operator", "spotray-system-nvidia-device-plugin",
                             "spotray-system-dcgm-exporter", "spotray-minio", "monitoring-kube-prometheus-stack"}
    pins = {KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, DCGM_EXPORTER, MINIO, KUBE_PROMETHEUS_STACK}
    for directory, release in releases.items():
        chart = next(c for c in pins if release["chart"].endswith(c.name))
        assert release["version"] == chart.version
        values = yaml.safe_load((out / "helm" / directory / "values.yaml").read_text())
        assert unknown_values_keys(values, pinned_chart_values(chart.name, chart.version)) == [], directory
    assert releases["kuberay-system-kuberay-operator"]["skipCrds"] is True
    assert (out / "crds.txt").read_text().count("/v1.7.0/") == 3


def test_generated_secrets_are_listed_by_key_and_never_written(dev):
    _, out = dev
    assert not [o for o in objects(out).values() if o["kind"] == "Secret"]
    listed = {s["name"]: s["keys"] for s in yaml.safe_load((out / "required-secrets.yaml").read_text())["secrets"]}
    assert listed["minio-root"] == ["root-password", "root-user"]
    assert listed["spotray-storage"] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    assert listed["grafana-admin"] == ["admin-password", "admin-user"]
    assert "generated-" not in "".join(p.read_text() for p in out.rglob("*") if p.is_file())


def test_rendering_again_gives_the_same_bytes_and_drops_objects_that_are_gone(dev, tmp_path):
    cfg, out = dev
    stale = out / "objects" / "spotray" / "configmap-old-run-config.yaml"
    stale.write_text("kind: ConfigMap\n")
    write(render(cfg), tmp_path / "again")
    write(render(cfg), out)
    assert not stale.exists()
    first = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    second = {p.relative_to(tmp_path / "again"): p.read_bytes() for p in (tmp_path / "again").rglob("*") if p.is_file()}
    assert first == second


def test_a_directory_holding_anything_else_is_refused_and_left_alone(tmp_path):
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(SpotrayError, match="not empty"):
        write(render(load_stack_file(REPO, "existing")), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.md"]


def test_the_training_job_rendered_is_the_one_the_builders_make_and_pulumi_deploys(project, tmp_path):
    cfg = stack(project)
    rendered = render(cfg)
    job = rendered.objects["objects/spotray/rayjob-gpt-small.yaml"]
    assert job == rayjob(cfg.training.run, job_settings(cfg))
    write(rendered, tmp_path / "out")
    assert cfg.kubernetes is not None
    for obj in objects(tmp_path / "out").values():
        check_valid(obj, cfg.kubernetes.version)


def test_the_command_renders_an_existing_cluster_stack_offline(tmp_path, capsys):
    assert main(["render", "--stack", "existing", "--out", str(tmp_path / "out"), "--project-dir", str(REPO)]) == 0
    assert "Helm releases" in capsys.readouterr().out
    assert (tmp_path / "out" / "objects" / "_cluster" / "namespace-spotray.yaml").is_file()


@pytest.mark.parametrize("name", STACKS)
def test_the_committed_render_of_every_stack_is_what_the_code_renders(name, stack_plans):
    differ = stale(render(*stack_plans[name]), REPO / "cluster" / "rendered" / name)
    assert differ == [], f"cluster/rendered/{name} is stale, run `make render`: {differ}"


def test_a_stale_render_is_named_file_by_file_and_fails_the_check(dev, tmp_path, capsys):
    cfg, out = dev
    copy = tmp_path / "dev"
    shutil.copytree(out, copy)
    (copy / "crds.txt").write_text("edited by hand\n")
    (copy / "objects" / "spotray" / "configmap-old.yaml").write_text("kind: ConfigMap\n")
    (copy / "required-secrets.yaml").unlink()
    assert stale(render(cfg), copy) == ["crds.txt", "objects/spotray/configmap-old.yaml", "required-secrets.yaml"]
    assert main(["render", "--stack", "dev", "--out", str(copy), "--check", "--project-dir", str(REPO)]) == 2
    assert "is stale: crds.txt" in capsys.readouterr().err and (copy / "crds.txt").read_text() == "edited by hand\n"
