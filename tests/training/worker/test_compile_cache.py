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


@pytest.mark.parametrize("workers", [1, 2])
def test_a_restart_takes_its_graphs_from_the_caches_the_first_attempt_kept(dataset_url, tmp_path, monkeypatch,
                                                                            workers):
    def attempt(stop_at: int, inductor_dir: str) -> dict:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / inductor_dir))  # each time a new node's disk
        return train_on_process_group(make_config(dataset_url, str(tmp_path), "c", *COMPILED,
                                                  f"scaling.num_workers={workers}",
                                                  f"train.stop_at_step={stop_at}").to_dict(), workers)

    assert attempt(2, "inductor-first")["graphs_from_compile_cache"] == 0
    kept = kept_caches(str(tmp_path))
    assert sorted(c.name for c in kept) == [f"rank-{r}.bin" for r in range(workers)] and all(c.size() for c in kept)
    again = attempt(4, "inductor-replacement")
    assert again["final_step"] == 4 and again["graphs_from_compile_cache"] >= 2  # a forward and a backward at least
    for cache in kept:
        cache.write_bytes(b"not a cache")
    damaged = attempt(6, "inductor-damaged")
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
