"""``train.compile``'s caches kept with the run (CPU, a bare process group): the attempt that compiled keeps them,
the next one, in new processes with an empty inductor cache folder, takes its graphs from them; a damaged cache costs
a compile, never the run."""

from __future__ import annotations

import pytest
import torch

from spotray.drills.process_group import train_on_process_group
from spotray.storage import resolve
from spotray.worker.attempt import WorkerEnv
from spotray.worker.compile_cache import CACHE_DIR, cache_key
from tests.training.configs import make_config

COMPILED = ("train.compile=true", "scaling.num_workers=1")


def kept_caches(root: str) -> list:
    folder = resolve(root).child("c", CACHE_DIR)
    return [folder.child(key, name) for key in folder.list_dir_names() for name in folder.child(key).list_names()]


def test_a_restart_takes_its_graphs_from_the_caches_the_first_attempt_kept(dataset_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-first"))
    first = train_on_process_group(make_config(dataset_url, str(tmp_path), "c", *COMPILED,
                                               "train.stop_at_step=2").to_dict(), 1)
    assert first["graphs_from_compile_cache"] == 0
    (kept,) = kept_caches(str(tmp_path))
    assert kept.name == "rank-0.bin" and kept.size() > 0
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-replacement"))  # a new node's disk
    again = train_on_process_group(make_config(dataset_url, str(tmp_path), "c", *COMPILED,
                                               "train.stop_at_step=4").to_dict(), 1)
    assert again["final_step"] == 4 and again["graphs_from_compile_cache"] >= 1
    kept.write_bytes(b"not a cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-damaged"))
    damaged = train_on_process_group(make_config(dataset_url, str(tmp_path), "c", *COMPILED,
                                                 "train.stop_at_step=6").to_dict(), 1)
    assert damaged["final_step"] == 6 and damaged["graphs_from_compile_cache"] == 0


@pytest.mark.parametrize("changed", ["parallel=fsdp", "scaling.num_workers=2"])
def test_the_key_holds_the_torch_version_device_parallelism_and_world_size(dataset_url, tmp_path, changed):
    cfg = make_config(dataset_url, str(tmp_path), "c", *COMPILED)
    env = WorkerEnv(0, 1, torch.device("cpu"), lambda _: None)
    key = cache_key(cfg, env)
    assert torch.__version__.replace("+", "_") in key and "cpu" in key and "ddp" in key and "-1-ranks" in key
    other = make_config(dataset_url, str(tmp_path), "c", *COMPILED, changed)
    workers = other.scaling.num_workers
    assert cache_key(other, WorkerEnv(0, workers, torch.device("cpu"), lambda _: None)) != key
