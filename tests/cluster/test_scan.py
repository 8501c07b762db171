"""checkov over every stack's render and over spotray's own pods (the RayJob's head, workers and submitter, and a
warm spare's Deployment) from a stack with training and warm spares on: checkov skips custom resources, so each
RayJob's pod templates are scanned as Pods. A finding outside ``.ci/checkov-skips.yaml`` fails. checkov lives in its
own virtualenv (``make test`` and ``make scan`` install it) and runs offline."""

import copy
import json
import subprocess

import pytest
import yaml

from infra.render import render
from tests.cluster.stacks import stack
from tests.repo import REPO, STACKS

CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
SKIPS = yaml.safe_load((REPO / ".ci" / "checkov-skips.yaml").read_text())
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/dev/training@sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def scanned(stack_plans, tmp_path_factory):
    """Every object to scan, by file name."""
    project = tmp_path_factory.mktemp("project")
    (project / "run.yaml").write_text(yaml.safe_dump({
        "run": {"name": "gpt-small"}, "data": {"path": "s3://spotray-dev/spotray/data"},
        "checkpoint": {"path": "s3://spotray-dev/spotray/ckpt"}, "scaling": {"num_workers": 2, "use_gpu": True}}))
    full = stack(project, gpu_pools=[{"name": "a10g-spot", "families": ["g5"], "warmSpares": 1}], image=IMAGE)
    renders = {name: render(*stack_plans[name]) for name in STACKS} | {"full": render(full)}
    objects = {}
    for name, rendered in renders.items():
        for path, obj in rendered.objects.items():
            objects[f"{name}/{path.replace('/', '_')}"] = obj
            objects |= {f"{name}/pod-{pod['metadata']['name']}.yaml": pod for pod in pods_of(obj)}
    assert any(o["kind"] == "Deployment" for o in objects.values()) and len(
        [o for o in objects.values() if o["kind"] == "Pod"]) == 3, "the full stack renders no job or spares"
    return objects


def pods_of(obj: dict) -> list[dict]:
    """A RayJob's head, worker-group and submitter templates as Pods."""
    if obj["kind"] != "RayJob":
        return []
    spec, meta = obj["spec"], obj["metadata"]
    cluster = spec["rayClusterSpec"]
    templates = {"head": cluster["headGroupSpec"]["template"], "submitter": spec["submitterPodTemplate"],
                 **{f"worker-{group['groupName']}": group["template"] for group in cluster["workerGroupSpecs"]}}
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{meta['name']}-{role}", "namespace": meta["namespace"],
                          "labels": template["metadata"]["labels"]}, "spec": template["spec"]}
            for role, template in templates.items()]


def findings(objects: dict, folder) -> set[tuple[str, str]]:
    """(check id, resource) of every failed check."""
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: `make test` or `make scan` installs checkov in its own virtualenv")
    for name, obj in objects.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(yaml.safe_dump(obj))
    proc = subprocess.run([str(CHECKOV), "-d", str(folder), "--framework", "kubernetes", "--skip-download",
                           "--quiet", "--compact", "-o", "json"], capture_output=True, text=True, timeout=300)
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    return {(check["check_id"], check["resource"]) for report in reports
            for check in report["results"]["failed_checks"]}


def unaccepted(found: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted((check, resource) for check, resource in found
                  if check not in SKIPS or resource not in SKIPS[check].get("only", [resource]))


def test_every_skip_gives_its_reason():
    assert SKIPS and all(set(skip) <= {"why", "only"} and len(skip["why"]) > 40 for skip in SKIPS.values())


def test_checkov_finds_nothing_outside_the_skip_list(scanned, tmp_path):
    found = findings(scanned, tmp_path)
    assert found, "checkov reported nothing at all: did it scan?"
    assert unaccepted(found) == []


def test_removing_one_security_context_field_is_a_finding(scanned, tmp_path):
    (name,) = [n for n in scanned if n.startswith("full/pod-") and n.endswith("-worker-gpu.yaml")]
    pod = copy.deepcopy(scanned[name])
    del pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"]
    found = findings({**{n: o for n, o in scanned.items() if n.startswith("full/")}, name: pod}, tmp_path)
    assert unaccepted(found) == [("CKV_K8S_20", f"Pod.spotray.{pod['metadata']['name']}")]
