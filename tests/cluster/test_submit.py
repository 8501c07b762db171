"""``spotray submit``: the job's manifests applied with kubectl. Kubernetes is not reachable here, so a stand-in
``kubectl`` on PATH records what it is asked and answers like the real one."""

import os
import stat

import pytest
import yaml

from cluster.submit import submit
from infra.cli import main
from spotray.config import load
from spotray.errors import SpotrayError
from tests.cluster.stacks import stack
from tests.repo import REPO

FAKE_KUBECTL = """#!/bin/sh
echo "$@" >> "$KUBECTL_LOG"
case "$*" in
  *"get rayjob "*) cat "$KUBECTL_EXISTING" 2>/dev/null || true ;;
  *"apply "*) cat > "$KUBECTL_APPLIED"; echo "rayjob.ray.io/gpt-small serverside-applied" ;;
esac
"""


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(FAKE_KUBECTL)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    files = {name: tmp_path / name for name in ("log", "existing", "applied")}
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name, path in files.items():
        monkeypatch.setenv(f"KUBECTL_{name.upper()}", str(path))
    return files


def run_config(project):
    return load(str(project / "run.yaml"))


def test_submit_applies_the_config_map_and_the_rayjob_server_side_on_the_given_context(project, kubectl):
    shown = submit(run_config(project), stack(project), context="staging")
    calls = kubectl["log"].read_text().splitlines()
    assert calls[0].startswith("--context staging get rayjob gpt-small -n spotray")
    assert calls[1] == "--context staging apply --server-side --field-manager=spotray -f -"
    kinds = [d["kind"] for d in yaml.safe_load_all(kubectl["applied"].read_text())]
    assert kinds == ["ConfigMap", "RayJob"]
    assert "kubectl -n spotray get rayjob gpt-small -w" in shown


def test_an_existing_job_of_the_same_name_is_not_overwritten(project, kubectl):
    kubectl["existing"].write_text("rayjob.ray.io/gpt-small\n")
    with pytest.raises(SpotrayError, match="already exists.*kubectl delete rayjob gpt-small -n spotray"):
        submit(run_config(project), stack(project))
    assert not kubectl["applied"].exists()


def test_dry_run_prints_the_manifests_without_kubectl(project, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    docs = list(yaml.safe_load_all(submit(run_config(project), stack(project), image="r.example.com/t:9",
                                          dry_run=True)))
    assert docs[1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == \
        "r.example.com/t:9"


def test_without_kubectl_the_error_says_how_to_go_on(project, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SpotrayError, match="kubectl is not on PATH.*--dry-run"):
        submit(run_config(project), stack(project))


def test_a_stack_without_a_training_image_asks_for_one(project, capsys):
    assert main(["submit", "--stack", "dev", "--config", str(project / "run.yaml"), "--dry-run",
                 "--project-dir", str(REPO)]) == 2
    err = capsys.readouterr().err
    assert "training.image" in err and "--image" in err


def test_a_local_working_dir_is_refused_saying_how_the_code_reaches_the_cluster(project, tmp_path, capsys):
    assert main(["submit", "--stack", "dev", "--config", str(project / "run.yaml"), "--set",
                 f"runtime.working_dir={tmp_path}", "--image", "r.example.com/t:9", "--dry-run",
                 "--project-dir", str(REPO)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "'runtime.working_dir'" in line and "bake the code into the training image" in line and "s3://" in line


def test_a_working_dir_uri_travels_to_the_job(project, monkeypatch):
    cfg = load(str(project / "run.yaml"), ["runtime.working_dir=s3://bucket/code/v1.zip"])
    config_map = next(yaml.safe_load_all(submit(cfg, stack(project), image="r.example.com/t:9", dry_run=True)))
    assert yaml.safe_load(config_map["data"]["train.yaml"])["runtime"]["working_dir"] == "s3://bucket/code/v1.zip"
