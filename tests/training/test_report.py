"""The closing lines of ``spotray train`` and ``spotray demo``."""

from __future__ import annotations

from spotray.console import line_kind
from spotray.report import format_summary, format_table

SUMMARY = {"run_name": "r", "final_step": 60, "final_loss": 2.5, "tokens_per_s": 12345.6, "goodput": 0.871,
           "exactly_once": True, "checkpoint_every_steps": 20, "events": [],
           "checkpoints": ["/ckpt/r/checkpoints/step_000000040", "/ckpt/r/checkpoints/step_000000060"]}
KILL = {"kind": "kill", "step": 33, "lost_steps": 13, "lost_steps_at_most": 22, "recovery_s": 12.25,
        "resumed_from": 20}


def test_a_run_without_interruptions_is_three_lines_of_known_kinds():
    lines = format_summary(SUMMARY).splitlines()
    assert lines == ["spotray: done: r at step 60, 12,346 tokens/s",
                     "goodput 87.1% | every sample exactly once: yes | final loss 2.5000 at step 60 | "
                     "checkpoint every 20 steps",
                     "spotray: checkpoints: 2 kept, the newest /ckpt/r/checkpoints/step_000000060"]
    assert all(line_kind(line) == "summary" for line in lines)


def test_interruptions_are_a_table_and_an_auto_interval_keeps_the_result_line():
    text = format_table({**SUMMARY, "events": [KILL], "checkpoint_every_steps": "auto", "exactly_once": None})
    lines = text.splitlines()
    assert lines[0].split() == ["event", "step", "lost", "steps", "(at", "most)", "resumed", "after"]
    assert lines[2].split() == ["kill", "33", "13", "(22)", "12.2", "s"]
    assert lines[-1] == ("goodput 87.1% | every sample exactly once: not audited | final loss 2.5000 at step 60 | "
                         "checkpoint auto (Young–Daly)")
    assert all(line_kind(line) == "summary" for line in lines if line)
