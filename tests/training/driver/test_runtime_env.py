import logging
import os
import sys
import zipfile

import pytest

from spotray.config import EnvSection, load
from spotray.driver.runtime_env import (
    STORAGE_ENV,
    check_working_dir,
    enter_working_dir,
    forwarded_env,
    packaged_files,
    ship_working_dir,
    shipped,
    unpack,
    worker_runtime_env,
)
from spotray.errors import ConfigError
from spotray.storage import resolve


def test_named_variables_and_storage_credentials_are_forwarded_and_values_never_logged(caplog):
    environ = {"WANDB_API_KEY": "secret-wandb", "AWS_ACCESS_KEY_ID": "AKIA-secret", "UNRELATED": "x"}
    with caplog.at_level(logging.WARNING):
        env = forwarded_env(EnvSection(forward=["WANDB_API_KEY", "HF_TOKEN"]), environ)
    assert env == {"WANDB_API_KEY": "secret-wandb", "AWS_ACCESS_KEY_ID": "AKIA-secret"}
    assert "HF_TOKEN" in caplog.text  # the missing name is reported ...
    assert "secret" not in caplog.text  # ... and no value ever is


def test_no_runtime_env_where_nothing_travels_or_the_nodes_have_it_so_ray_reuses_idle_workers(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", "secret-wandb")
    for name in STORAGE_ENV:
        monkeypatch.delenv(name, raising=False)
    assert worker_runtime_env(load(None, ["data.path=/d"])) == {}
    assert worker_runtime_env(load(None, ["data.path=/d", "env.forward=[WANDB_API_KEY]"])) == {
        "env_vars": {"WANDB_API_KEY": "secret-wandb"}}
    assert worker_runtime_env(load(None, ["data.path=/d", "env.forward=[WANDB_API_KEY]", "env.on_nodes=true"])) == {}
    project = tmp_path / "project"
    project.mkdir()
    cfg = load(None, ["data.path=/d", "env.on_nodes=true", f"runtime.working_dir={project}"])
    assert worker_runtime_env(cfg) == {}  # a shipped working dir is unpacked by the worker, not by Ray


@pytest.mark.parametrize("bad", ["WANDB_API_KEY=abc", "has space", ""])
def test_forward_takes_names_not_values(bad):
    with pytest.raises(ConfigError, match="env.forward"):
        EnvSection(forward=[bad])


def make_tree(root):
    (root / "pkg" / "data").mkdir(parents=True)
    (root / "pkg" / "code.py").write_text("print('hi')\n")
    (root / "pkg" / "data" / "__init__.py").write_text("ROWS = 3\n")
    for junk in (".venv/lib/big.so", "spotray-runs/run/x.distcp", "core.1234", "pkg/__pycache__/code.pyc",
                 ".git/objects/ab/cdef", "checkpoints/step_000000010/__0_0.distcp"):
        path = root / junk
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"0" * 4096)


def test_packaging_excludes_dumps_checkpoints_venvs_and_vcs_but_not_a_package_named_data(tmp_path):
    make_tree(tmp_path)
    expected = ["pkg/code.py", "pkg/data/__init__.py"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p, _ in packaged_files(tmp_path)) == expected
    assert sorted(p.relative_to(tmp_path).as_posix() for p, _ in check_working_dir(str(tmp_path), 1)) == expected


def test_a_working_dir_ships_once_per_content_under_one_top_level_directory(tmp_path, storage_root):
    make_tree(tmp_path / "project")
    code = storage_root.child("code")
    uri = ship_working_dir(str(tmp_path / "project"), 1, code)
    assert uri == (code.child(code.list_names()[0]).url if storage_root.is_s3 else f"file://{code.path}/"
                   f"{code.list_names()[0]}") and uri.endswith(".zip")
    assert ship_working_dir(str(tmp_path / "project"), 1, code) == uri and len(code.list_names()) == 1
    (tmp_path / "package.zip").write_bytes(code.child(code.list_names()[0]).read_bytes())
    with zipfile.ZipFile(tmp_path / "package.zip") as package:  # Ray strips the one top-level directory
        assert sorted(package.namelist()) == ["working_dir/pkg/code.py", "working_dir/pkg/data/__init__.py"]
    (tmp_path / "project" / "pkg" / "code.py").write_text("print('changed')\n")
    assert ship_working_dir(str(tmp_path / "project"), 1, code) != uri and len(code.list_names()) == 2


def test_a_working_dir_uri_is_fetched_by_the_worker_or_by_ray_where_storage_cannot_read_it_and_names_a_zip():
    for uri, ray_fetches in (("s3://bucket/code/v1.zip", False), ("https://example.com/code/v1.zip", True)):
        cfg = load(None, ["data.path=/d", f"runtime.working_dir={uri}", "env.on_nodes=true"])
        assert worker_runtime_env(cfg) == ({"working_dir": uri} if ray_fetches else {})
        assert shipped(cfg, resolve("/unused")) is cfg
    with pytest.raises(ConfigError, match=r"runtime.working_dir.*s3://bucket/code is a URI but not of a \.zip"):
        load(None, ["data.path=/d", "runtime.working_dir=s3://bucket/code"])


def test_a_worker_runs_in_the_unpacked_package_fetched_once_per_node_and_content(tmp_path, storage_root,
                                                                                monkeypatch):
    make_tree(tmp_path / "project")
    (tmp_path / "project" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "project" / "run.sh").chmod(0o755)
    endpoint = [f"storage.endpoint_url={storage_root.options.endpoint_url}"] if storage_root.is_s3 else []
    cfg = shipped(load(None, ["data.path=/d", f"runtime.working_dir={tmp_path / 'project'}", *endpoint]),
                  storage_root)
    assert cfg.runtime.working_dir is not None
    assert cfg.runtime.working_dir.startswith(("s3://", "file://")) and cfg.runtime.working_dir.endswith(".zip")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    enter_working_dir(cfg, cache=tmp_path / "cache")
    here = os.getcwd()
    assert sys.path[0] == here and os.path.dirname(here) == str(tmp_path / "cache")
    assert sorted(str(p.relative_to(here)) for p in __import__("pathlib").Path(here).rglob("*") if p.is_file()) == [
        "pkg/code.py", "pkg/data/__init__.py", "run.sh"]
    assert os.access("run.sh", os.X_OK)  # modes travel
    package = resolve(cfg.runtime.working_dir, cfg.storage.options())
    monkeypatch.setattr(type(package), "read_bytes", lambda self: pytest.fail("fetched twice"))
    assert str(unpack(package, tmp_path / "cache")) == here  # another worker of the node takes the folder


def test_a_package_replaced_under_the_same_url_is_fetched_again_and_one_escaping_its_folder_is_refused(tmp_path):
    package = tmp_path / "code.zip"
    for content in ("A = 1\n", "A = 22\n"):
        with zipfile.ZipFile(package, "w") as archive:
            archive.writestr("project/mod.py", content)
        assert (unpack(resolve(str(package)), tmp_path / "cache") / "mod.py").read_text() == content
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("mod.py", "")
        archive.writestr("../evil.py", "")
    with pytest.raises(ConfigError, match=r"runtime.working_dir': the package holds \.\./evil.py"):
        unpack(resolve(str(package)), tmp_path / "cache")
    assert not (tmp_path / "evil.py").exists()


def test_oversized_working_dir_is_refused_listing_the_biggest_files(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "pkg" / "huge_table.csv").write_bytes(b"1" * (3 * 2**20))
    with pytest.raises(ConfigError, match=r"runtime.working_dir.*over the 2 MiB limit.*pkg/huge_table.csv \(3.0 MiB\)"):
        check_working_dir(str(tmp_path), limit_mb=2)
