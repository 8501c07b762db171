"""``make publish-render``: a stack's render committed to its environment branch on the remote, once per change."""

import os
import subprocess

from infra.kernel.config import load_stack_file
from infra.render import render, write
from tests.repo import REPO


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def publish(stack: str, remote) -> str:
    proc = subprocess.run([str(REPO / ".ci" / "publish-render"), stack], capture_output=True, text=True,
                          env={**os.environ, "PUBLISH_REMOTE": str(remote)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_render_lands_on_its_environment_branch_and_an_unchanged_one_adds_no_commit(tmp_path):
    remote = tmp_path / "remote.git"
    git("init", "--quiet", "--bare", str(remote))
    assert "published render of existing" in publish("existing", remote)
    write(render(load_stack_file(REPO, "existing")), tmp_path / "expected")
    expected = sorted(p.relative_to(tmp_path / "expected").as_posix()
                      for p in (tmp_path / "expected").rglob("*") if p.is_file())
    branch = "refs/heads/rendered/existing"
    assert sorted(git("--git-dir", str(remote), "ls-tree", "-r", "--name-only", branch).split()) == expected
    assert git("--git-dir", str(remote), "log", "--format=%s", branch).strip() == \
        f"render of stack existing at {git('-C', str(REPO), 'rev-parse', 'HEAD').strip()}"

    assert "unchanged" in publish("existing", remote)
    assert git("--git-dir", str(remote), "rev-list", "--count", branch).strip() == "1"
    assert git("--git-dir", str(remote), "branch", "--list").split() == ["rendered/existing"]
    assert "publish-render" not in git("-C", str(REPO), "branch", "--list")  # nothing left behind locally
