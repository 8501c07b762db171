"""``torch.compile``'s compiling is its own goodput category, not a slow first step counted as productive."""

from __future__ import annotations

import torch
from torch._dynamo.callback import callback_handler

from spotray.accounts import goodput
from spotray.drills.process_group import train_on_process_group
from spotray.storage import resolve
from spotray.worker.compile_time import CompileTimer
from tests.training.configs import make_config


def test_the_timer_counts_a_compile_once_and_a_cached_call_not_and_leaves_no_callback_behind():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.sin(x) * 2)
    with CompileTimer() as timer:
        compiled(torch.ones(3))
        assert timer.take() > 0
        compiled(torch.ones(3))
        assert timer.take() == 0
    assert timer._started not in callback_handler.start_callbacks
    assert timer._ended not in callback_handler.end_callbacks


def test_a_compiled_runs_first_step_is_trained_time_and_its_compiling_is_the_compile_category(split_dataset_url,
                                                                                           tmp_path, monkeypatch):
    """Before: step 1 took the whole compile (15 s of a 40 s run) and goodput read 38 % where the steps took 2 %."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # compiles, whatever ran before
    cfg = make_config(split_dataset_url, str(tmp_path), "c", "train.compile=true", "scaling.num_workers=1",
                      "train.max_steps=4", "eval.every_steps=2", "eval.samples=8")
    train_on_process_group(cfg.to_dict(), 1)

    [attempt] = goodput.attempt_records(resolve(str(tmp_path)).child("c", "attempts"))
    compile_s = attempt.status_of("compile_s")
    assert compile_s > 1.0, "the model's forward and backward, and the evaluation's forward, compiled"
    assert attempt.steps[1].seconds < max(attempt.steps[s].seconds for s in (2, 3, 4)) + 0.5
    assert goodput.account_of([attempt], None).seconds["compile"] == compile_s
