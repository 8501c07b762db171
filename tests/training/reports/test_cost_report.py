"""``spotray cost`` as docs/cost.md shows it, over ledgers that name their nodes and prices; and ``status``'s cost."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from spotray.accounts import endings, goodput, ledger, node_records
from spotray.cli import main
from spotray.reports.status import format_text, gather
from spotray.storage import resolve
from tests.repo import readme_example

T0 = 1_790_000_000.0


def write_run(runs, name: str, price: float | None, interrupted: bool = False, on_demand: float = 1.006) -> None:
    """A run of 2 workers on nodes of their own, 100 steps of 1,000 tokens in an hour; ``interrupted``: a kill at
    step 60 after a checkpoint at 50, and the replacement node n3."""
    attempts = resolve(str(runs / name)).child("attempts")
    attempts.child(ledger._RUN_FILE).write_text(json.dumps({"started_at": T0}))
    plan = [("a", 0, 60, T0, T0 + 2160, ["n1", "n2"]), ("b", 50, 100, T0 + 2300, T0 + 4100, ["n1", "n3"])] \
        if interrupted else [("a", 0, 100, T0, T0 + 3600, ["n1", "n2"])]
    writer = ledger.RecordWriter()
    for aid, start, end, entered, last_seen, where in plan:
        ledger.write_attempt(attempts, ledger.AttemptInfo(aid, start, 2, 4, started_at=entered, nodes=where))
        losses = ledger.LossLog(attempts, aid, writer)
        for step in range(start + 1, end + 1):
            losses.record(step, 1.0, (last_seen - entered) / (end - start), tokens=1000)
        losses.flush()
        writer.put(ledger.attempt_file(attempts, aid, goodput.STATUS_FILE),
                   json.dumps({"entered_at": entered, "last_seen": last_seen, "max_steps": 100}))
    writer.close(timeout_s=10)
    facts = {n: node_records.NodeFacts(n, "g5.xlarge", "spot", "us-east-1a", T0 - 7200, 1, price,
                                       on_demand if price else None) for n in ("n1", "n2", "n3")}
    if interrupted:  # the driver saw n2 go, and recorded it as what ended attempt a
        facts["n2"] = replace(facts["n2"], lost_at=T0 + 2170, lost_reason="UNEXPECTED_TERMINATION")
        endings.record(attempts, "a", endings.KILL, "node n2 (spot) lost: Ray says UNEXPECTED_TERMINATION")
    attempts.child(node_records.NODES_FILE).write_text(json.dumps({n: f.to_dict() for n, f in facts.items()}))
    attempts.child(node_records.COST_FILE).write_text(json.dumps({"example_prices": False, "warm_spares": 0,
                                                                  "head": None}))


def test_the_readme_example_prints_a_line_per_run_and_a_total(tmp_path, monkeypatch, capsys):
    write_run(tmp_path / "spotray-runs", "gpt-small", 0.45, interrupted=True)
    write_run(tmp_path / "spotray-runs", "llama", 0.45)
    monkeypatch.chdir(tmp_path)
    command = shlex.split(readme_example("cost-example"))
    assert command[0] == "spotray"
    assert main(command[1:]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["run", *(str(resolve(f"spotray-runs/{n}").url)
                                                          for n in ("gpt-small", "llama")), "total"], lines
    assert main([*command[1:], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    gpt, llama = report["runs"]
    assert (gpt["spot_interruptions"], gpt["endings"]) == (1, ["kill"]) and llama["endings"] == []
    assert report["total"]["spot_interruptions"] == 1
    assert llama["usd"] == pytest.approx(2 * 0.45) and llama["tokens"] == 100_000
    assert llama["usd_per_million_tokens"] == pytest.approx(2 * 0.45 / 0.1)
    assert report["total"]["usd"] == pytest.approx(sum(r["usd"] for r in report["runs"]))
    assert report["total"]["tokens"] == 200_000


def test_one_runs_total_is_its_row_even_where_its_bill_is_a_fraction_of_a_cent(tmp_path, capsys):
    """The total sums the runs' unrounded figures: summed after rounding, a demo's saving read 45.4 %, its row 45.5."""
    write_run(tmp_path, "tiny", 0.0000921, on_demand=0.000169)
    assert main(["cost", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (run,), total = report["runs"], report["total"]
    assert {key: total[key] for key in run if key in total} == {key: run[key] for key in total if key in run}
    assert run["saving"] == pytest.approx(0.455, abs=0.001)
    assert main(["cost", str(tmp_path)]) == 0
    assert "total (1 run) " in capsys.readouterr().out


def test_a_run_without_prices_shows_unknown_and_makes_the_total_unknown(tmp_path, capsys):
    write_run(tmp_path, "priced", 0.45)
    write_run(tmp_path, "unpriced", None)
    assert main(["cost", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"][1]["usd"] is None and report["total"]["usd"] is None
    assert main(["cost", str(tmp_path / "unpriced")]) == 0
    assert "unknown" in capsys.readouterr().out


def test_a_url_holding_no_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["cost", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a run and holds none" in err


def test_status_shows_the_cost_and_the_rate_the_run_has_seen(tmp_path):
    write_run(tmp_path, "run", 0.45, interrupted=True)
    status = gather(str(tmp_path / "run"))
    bill = status["cost"]
    # n1 through the recovery, n2 until the kill (created 2 h before: billed), n3 from the second attempt
    hours = (4100 + 2160 + (4100 - 2300)) / 3600
    assert bill["usd"] == pytest.approx(hours * 0.45) and bill["nodes_interrupted"] == 1
    assert bill["tokens"] == 100 * 1000  # the kept steps only
    text = format_text(status)
    assert "cost         $" in text and "per million tokens" in text and "spot saved" in text
    assert "1 spot node interrupted in" in text and "plan with the pool's rate" in text
