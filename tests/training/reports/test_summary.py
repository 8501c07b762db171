"""The closing lines of ``spotray train`` and ``spotray demo``."""

from __future__ import annotations

from typing import Any

from spotray.reports.summary import format_summary, format_table, plot_losses
from tests.console import line_kind

SUMMARY = {"run_name": "r", "final_step": 60, "final_loss": 2.5, "tokens_per_s": 12345.6, "goodput": 0.871,
           "exactly_once": True, "checkpoint_every_steps": 20, "events": [],
           "checkpoints": ["/ckpt/r/checkpoints/step_000000040", "/ckpt/r/checkpoints/step_000000060"]}
KILL = {"kind": "kill", "reason": "node n2 (spot) lost: Ray says UNEXPECTED_TERMINATION", "spot": True, "step": 33,
        "lost_steps": 13, "lost_steps_at_most": 22, "recovery_s": 12.25, "resumed_from": 20, "from_snapshot": False}


def test_a_run_without_interruptions_is_three_lines_of_known_kinds():
    lines = format_summary(SUMMARY).splitlines()
    assert lines == ["spotray: done: r at step 60, 12,346 tokens/s",
                     "goodput 87.1% | every sample exactly once: yes | final loss 2.5000 at step 60 | "
                     "checkpoint every 20 steps",
                     "spotray: checkpoints: 2 kept, the newest /ckpt/r/checkpoints/step_000000060"]
    assert all(line_kind(line) == "summary" for line in lines)


def test_interruptions_are_a_table_saying_where_each_resumed_and_an_auto_interval_keeps_the_result_line():
    from_memory = {**KILL, "step": 50, "lost_steps": 2, "lost_steps_at_most": 2, "resumed_from": 48,
                   "from_snapshot": True}
    text = format_table({**SUMMARY, "events": [KILL, from_memory], "checkpoint_every_steps": "auto",
                         "exactly_once": None})
    lines = text.splitlines()
    assert lines[0].split() == ["ending", "step", "lost", "steps", "(at", "most)", "resumed", "from", "resumed",
                                "after"]
    assert lines[2].split() == ["kill", "33", "13", "(22)", "20", "(checkpoint)", "12.2", "s"]
    assert lines[3].split() == ["kill", "50", "2", "48", "(snapshot)", "12.2", "s"]
    assert lines[-1] == ("goodput 87.1% | every sample exactly once: not audited | final loss 2.5000 at step 60 | "
                         "checkpoint auto (Young–Daly)")
    assert all(line_kind(line) == "summary" for line in lines if line)


def test_a_stop_is_a_row_of_its_own_and_a_scripts_unknown_interval_says_so():
    stop = {**KILL, "kind": "stopped", "reason": "Ctrl-C", "spot": False, "lost_steps": 0, "lost_steps_at_most": 0,
            "recovery_s": None}
    lines = format_table({**SUMMARY, "events": [stop, KILL], "checkpoint_every_steps": None}).splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["stopped", "kill"] and lines[2].split()[-1] == "-"
    assert lines[-1].endswith("| checkpoint interval unknown")
    assert all(line_kind(line) == "summary" for line in lines if line)


EVALS = {"20": {"val_loss": 3.1, "val_perplexity": 22.2}, "40": {"val_loss": 2.75, "val_perplexity": 15.6},
         "60": {"val_loss": 2.8, "val_perplexity": 16.4}}


def test_an_evaluated_runs_result_line_has_its_last_val_loss_and_its_best_checkpoint():
    best = {"step": 40, "val_loss": 2.75, "url": "/ckpt/r/checkpoints/step_000000040"}
    line = format_table({**SUMMARY, "evals": EVALS, "val_loss": 2.8, "best": best})
    assert line == ("goodput 87.1% | every sample exactly once: yes | final loss 2.5000 at step 60 | checkpoint every "
                    "20 steps | val loss 2.8000 at step 60 (best 40: 2.7500)")
    assert line_kind(line) == "summary"
    # no checkpoint has a val loss (none kept, or only emergency ones): the best is the lowest evaluation
    assert format_table({**SUMMARY, "evals": EVALS, "val_loss": 2.8, "best": None}).endswith(
        "| val loss 2.8000 at step 60 (best 40: 2.7500)")


def test_a_final_loss_the_ledger_lacks_is_said_so_not_a_traceback():
    assert format_table({**SUMMARY, "final_loss": None}) == (
        "goodput 87.1% | every sample exactly once: yes | final loss not recorded at step 60 | checkpoint every 20 "
        "steps")


def test_a_final_loss_logged_before_the_final_step_is_shown_at_its_own_step():
    assert "| final loss 2.5000 at step 57 |" in format_table({**SUMMARY, "final_loss_step": 57})


def test_a_run_that_never_evaluated_keeps_its_result_line():
    expected = format_table(SUMMARY)
    assert format_table({**SUMMARY, "evals": {}, "val_loss": None, "best": None}) == expected
    assert "val loss" not in expected


def plotted(monkeypatch, summary: dict, path) -> dict:
    """plot_losses' figure as saved: each line's label and points, and the legend's labels."""
    from matplotlib.figure import Figure

    seen: dict[str, Any] = {}
    savefig = Figure.savefig

    def capture(fig, *args, **kwargs):
        ax = fig.axes[0]
        seen["lines"] = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()), line.get_marker())
                         for line in ax.get_lines()}
        legend = ax.get_legend()
        seen["legend"] = [t.get_text() for t in legend.get_texts()] if legend else []
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    assert plot_losses(summary, str(path)) == str(path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and path.stat().st_size > 1000
    return seen


def test_the_loss_curve_draws_the_val_loss_beside_the_training_loss(monkeypatch, tmp_path):
    losses = {str(s): 5.0 / s for s in range(1, 61)}
    seen = plotted(monkeypatch, {**SUMMARY, "losses": losses, "evals": EVALS, "events": [KILL]},
                   tmp_path / "plots" / "loss_curve.png")
    assert seen["legend"] == ["training loss", "val loss"]
    steps, values, marker = seen["lines"]["val loss"]
    assert (steps, values) == ([20, 40, 60], [3.1, 2.75, 2.8]) and marker not in ("", "None", None)
    assert seen["lines"]["training loss"][0] == list(range(1, 61))


def test_the_loss_curve_of_a_run_that_never_evaluated_has_no_val_curve_nor_legend(monkeypatch, tmp_path):
    seen = plotted(monkeypatch, {**SUMMARY, "losses": {"1": 3.0, "2": 2.9}, "evals": {}}, tmp_path / "curve.png")
    assert list(seen["lines"]) == ["training loss"] and seen["legend"] == []
    seen = plotted(monkeypatch, {**SUMMARY, "losses": {"1": 3.0, "2": 2.9}}, tmp_path / "older.png")  # no "evals"
    assert list(seen["lines"]) == ["training loss"] and seen["legend"] == []
