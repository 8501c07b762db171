"""``spotray train`` as spotray's pods run it (``cluster/pod_security.py``): a UID with no passwd entry and no
USER, a HOME that cannot be written (it lies under a file, which stops root too), and nothing writable but the
scratch (``/tmp`` in a pod: here ``TMPDIR`` and ``RAY_TMPDIR``), the cache folder and the run's storage. The UID is
switched with ``setpriv`` where this machine lets another user run the interpreter (a Python under a private
``/root`` does not); elsewhere the run keeps the current user and the rest of the conditions."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cluster.pod_security import CACHE_VARIABLES
from tests.corpus import write_corpus

UID, GID = 4242, 100
SPOTRAY = Path(sys.executable).parent / "spotray"

def _as_pod_user() -> list[str]:
    """``setpriv`` to UID, where it can run this interpreter; else nothing."""
    switch = ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups"]
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return []
    # The child's exec is the test: setpriv's own exec still has root's capabilities to find the interpreter.
    probe = subprocess.run([*switch, sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
                            "'-c', 'pass'], check=True)"], capture_output=True)
    return switch if probe.returncode == 0 else []


def _owned(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, UID, GID)
    return path


@pytest.mark.cluster  # starts a Ray of its own
@pytest.mark.e2e
def test_training_runs_with_no_passwd_entry_no_writable_home_and_only_the_pods_writable_paths():
    with pytest.raises(KeyError):
        pwd.getpwuid(UID)
    work = Path(tempfile.mkdtemp(prefix="spotray-nonroot-"))  # pytest's tmp_path is private to root
    try:
        corpus = write_corpus(work / "corpus", documents=8)
        scratch, cache = _owned(work / "tmp"), _owned(work / "cache")
        _owned(work)
        (work / "not-a-dir").write_text("")
        env = {"PATH": os.environ["PATH"], "HOME": str(work / "not-a-dir" / "home"), "TMPDIR": str(scratch),
               "RAY_TMPDIR": str(scratch), "RAY_USAGE_STATS_ENABLED": "0",
               **{name: value.replace("/cache", str(cache)) for name, value in CACHE_VARIABLES.items()}}
        switch = _as_pod_user()
        as_pod = [*switch, str(SPOTRAY)]
        prep = subprocess.run([*as_pod, "prepare", "--input", corpus, "--output", str(work / "data")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:]
        run = subprocess.run([*as_pod, "train", "--json", "--set", f"data.path={work}/data", "--set",
                              f"checkpoint.path={work}/ckpt", "--set", "train.max_steps=4", "--set",
                              "checkpoint.every_steps=2", "--set", "train.seq_len=32", "--set",
                              "scaling.num_workers=2", "--set", "run.name=nonroot"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-4000:]
        assert '"final_step": 4' in run.stdout
        if switch:
            assert all(p.stat().st_uid == UID for p in (work / "ckpt").rglob("*")), "everything written is its own"
    finally:
        shutil.rmtree(work, ignore_errors=True)
