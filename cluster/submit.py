"""``spotray submit``: an ad-hoc training RayJob and its config map on the current kube-context, built by the
same functions as the job ``pulumi up`` deploys, applied with ``kubectl``."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from cluster.rayjob import config_map, job_name, job_settings, rayjob
from infra.kernel.config import StackConfig
from spotray.config import TrainConfig
from spotray.errors import SpotrayError


def manifests(train: TrainConfig, stack: StackConfig, image: str | None = None,
              gpu_pool: str | None = None) -> list[dict]:
    settings = job_settings(stack, image, gpu_pool)
    return [config_map(train, settings), rayjob(train, settings)]


def submit(train: TrainConfig, stack: StackConfig, image: str | None = None, gpu_pool: str | None = None,
           context: str | None = None, dry_run: bool = False) -> str:
    """Applies the job (or, with ``dry_run``, returns its manifests). Returns what to show the user."""
    docs = manifests(train, stack, image, gpu_pool)
    text = yaml.safe_dump_all(docs, sort_keys=True)
    if dry_run:
        return text
    name, namespace = job_name(train), docs[1]["metadata"]["namespace"]
    kubectl = [_kubectl(), *(["--context", context] if context else [])]
    existing = _run([*kubectl, "get", "rayjob", name, "-n", namespace, "--ignore-not-found", "-o", "name"])
    if existing.strip():
        raise SpotrayError(
            f"a RayJob named {name} already exists in namespace {namespace}; to run it again, "
            f"`kubectl delete rayjob {name} -n {namespace}` first (its checkpoints stay in storage and the new job "
            "resumes from them), or choose another run.name")
    applied = _run([*kubectl, "apply", "--server-side", "--field-manager=spotray", "-f", "-"], text)
    return f"{applied.strip()}\nfollow it: kubectl -n {namespace} get rayjob {name} -w"


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if not found:
        raise SpotrayError("kubectl is not on PATH: install it, or print the manifests with --dry-run and apply "
                           "them another way")
    return found


def _run(cmd: list[str], stdin: str | None = None) -> str:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SpotrayError(f"`{' '.join(cmd[1:])}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout
