"""`spotray demo`, shortened: both interruptions happen, are reported, and the run still trains every sample once."""

from __future__ import annotations

import json

from infra.cli import main


def test_demo_survives_a_notice_and_a_kill_and_reports_them(tmp_path):
    shorter = ["--set", "train.max_steps=150", "--set", "checkpoint.every_steps=25", "--set", "train.log_every=5"]
    assert main(["demo", "--workdir", str(tmp_path / "runs"), "--json", str(tmp_path / "demo.json"), *shorter]) == 0
    written = json.loads((tmp_path / "demo.json").read_text())
    assert written["injected"] == ["notice", "kill"]
    events = written["events"]
    assert [e["kind"] for e in events] == ["notice", "kill"], events
    assert events[0]["lost_steps"] == 0
    assert 0 <= events[1]["lost_steps"] <= written["checkpoint_every_steps"] == 25
    assert all(e["recovery_s"] > 0 for e in events)
    assert written["exactly_once"] is True and written["final_step"] == 150
    assert 0 < written["goodput"] < 1 and written["final_loss"] < 5.5
    assert open(written["loss_curve_png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
