import logging

import pytest

from training.config import EnvSection, load
from training.errors import ConfigError
from training.runtime_env import STORAGE_ENV, check_working_dir, forwarded_env, packaged_files, worker_runtime_env


def test_named_variables_and_storage_credentials_are_forwarded_and_values_never_logged(caplog):
    environ = {"WANDB_API_KEY": "secret-wandb", "AWS_ACCESS_KEY_ID": "AKIA-secret", "UNRELATED": "x"}
    with caplog.at_level(logging.WARNING):
        env = forwarded_env(EnvSection(forward=["WANDB_API_KEY", "HF_TOKEN"]), environ)
    assert env == {"WANDB_API_KEY": "secret-wandb", "AWS_ACCESS_KEY_ID": "AKIA-secret"}
    assert "HF_TOKEN" in caplog.text  # the missing name is reported ...
    assert "secret" not in caplog.text  # ... and no value ever is


def test_no_runtime_env_where_nothing_travels_or_the_nodes_have_it_so_ray_reuses_idle_workers(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-wandb")
    for name in STORAGE_ENV:
        monkeypatch.delenv(name, raising=False)
    assert worker_runtime_env(load(None, ["data.path=/d"])) == {}
    assert worker_runtime_env(load(None, ["data.path=/d", "env.forward=[WANDB_API_KEY]"])) == {
        "env_vars": {"WANDB_API_KEY": "secret-wandb"}}
    assert worker_runtime_env(load(None, ["data.path=/d", "env.forward=[WANDB_API_KEY]", "env.on_nodes=true"])) == {}


@pytest.mark.parametrize("bad", ["WANDB_API_KEY=abc", "has space", ""])
def test_forward_takes_names_not_values(bad):
    with pytest.raises(ConfigError, match="env.forward"):
        EnvSection(forward=[bad])


def make_tree(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "code.py").write_text("print('hi')\n")
    for junk in (".venv/lib/big.so", "spotray-runs/run/x.distcp", "data/shard-00000.bin", "core.1234",
                 "pkg/__pycache__/code.pyc", "model.pt"):
        path = root / junk
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"0" * 4096)


def test_packaging_excludes_dumps_checkpoints_venvs_and_data(tmp_path):
    make_tree(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p, _ in packaged_files(tmp_path)] == ["pkg/code.py"]
    assert check_working_dir(str(tmp_path), limit_mb=1)["working_dir"] == str(tmp_path.resolve())


def test_oversized_working_dir_is_refused_listing_the_biggest_files(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "pkg" / "huge_table.csv").write_bytes(b"1" * (3 * 2**20))
    with pytest.raises(ConfigError, match=r"runtime.working_dir.*over the 2 MiB limit.*pkg/huge_table.csv \(3.0 MiB\)"):
        check_working_dir(str(tmp_path), limit_mb=2)
