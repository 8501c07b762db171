"""`spotray demo`, shortened: both interruptions happen, are reported, and the run still trains every sample once;
after the notice's emergency checkpoint the workers move to the replacement node instead of waiting."""

from __future__ import annotations

import json

from spotray import goodput, ledger
from spotray.console import line_kind
from spotray.infra.cli import main
from spotray.storage import resolve
from tests.console import assert_full_log, assert_quiet_console, the_log


def test_demo_survives_a_notice_and_a_kill_and_reports_them(tmp_path, capfd):
    shorter = ["--set", "train.max_steps=150", "--set", "checkpoint.every_steps=25", "--set", "train.log_every=5"]
    assert main(["demo", "--workdir", str(tmp_path / "runs"), "--json", str(tmp_path / "demo.json"), *shorter]) == 0
    written = json.loads((tmp_path / "demo.json").read_text())
    assert written["injected"] == ["notice", "kill"]
    events = written["events"]
    assert [e["kind"] for e in events] == ["notice", "kill"], events
    assert events[0]["lost_steps"] == events[0]["lost_steps_at_most"] == 0  # exact after a committed notice
    assert 0 <= events[1]["lost_steps"] <= written["checkpoint_every_steps"] == 25
    assert events[1]["lost_steps_at_most"] == events[1]["lost_steps"] + 2 * 5 - 1  # two log intervals unwritten
    attempts = resolve(str(tmp_path / "runs")).child(written["run_name"], "attempts")
    noticed = goodput.read_status(attempts, ledger.read_attempts(attempts)[0].attempt_id)
    assert noticed["moved_at"] is not None and noticed["drain_wait_s"] < 20  # not the 20 s drain deadline
    assert all(e["recovery_s"] > 0 for e in events)
    assert written["exactly_once"] is True and written["final_step"] == 150
    assert 0 < written["goodput"] < 1 and written["final_loss"] < 5.5
    assert open(written["loss_curve_png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    out, err = capfd.readouterr()
    assert_quiet_console(out + err, "PREEMPTION NOTICE at step", "MOVING ON from step", "INTERRUPTED at step",
                         "loss curve: ")
    assert [line_kind(line) for line in err.splitlines()].count("recovery") == 3  # the move and two resumptions
    assert_full_log(the_log(tmp_path / "runs" / written["run_name"], err), last_step=150)
