"""``spotray cost RUN_URL ...``: one line per run (a run's URL, or a prefix holding runs) and a total."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import TYPE_CHECKING

from spotray.errors import SpotrayError

if TYPE_CHECKING:  # the CLI imports this module to register the command: pyarrow waits until it runs
    from spotray.storage import Location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_URL",
                        help="a run (<checkpoint.path>/<run.name>), or a prefix holding runs (<checkpoint.path>)")
    parser.add_argument("--json", action="store_true", help="the rows and the total as JSON")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO)")


def run(args: argparse.Namespace) -> None:
    from spotray.storage import StorageOptions, resolve

    options = StorageOptions(endpoint_url=args.endpoint_url)
    rows = [row(root) for url in args.runs for root in runs_at(resolve(url, options))]
    report = {"runs": [_rounded(r) for r in rows], "total": _rounded(total(rows))}
    print(json.dumps(report, indent=2) if args.json else format_text(report))


def runs_at(location: Location) -> list[Location]:
    """``location`` if it is a run, else the runs directly under it."""
    from spotray.accounts import ledger

    if ledger.attempts_root(location).is_dir():
        return [location]
    runs = [location.child(name) for name in sorted(location.list_names()) if location.child(name, "attempts").is_dir()]
    if not runs:
        from spotray.reports.status import RUN_URL_HINT  # status reads checkpoints: torch, only for this message

        raise SpotrayError(f"{location.url} is not a run and holds none: {RUN_URL_HINT}, or the prefix holding runs")
    return runs


def row(root: Location) -> dict:
    from spotray.accounts import cost, goodput, ledger

    attempts = ledger.attempts_root(root)
    records = goodput.attempt_records(attempts)
    account = goodput.account_of(records, ledger.run_started_at(attempts))
    bill = cost.ledger_cost(attempts, records, account)
    return {"run": root.url, "tokens": bill.tokens, "wall_s": account.total_s, "goodput": account.goodput,
            "spot_interruptions": len(account.interruptions), "endings": [event.kind for event in account.events],
            "usd": bill.usd, "usd_per_million_tokens": bill.usd_per_million_tokens, "on_demand_usd": bill.on_demand_usd,
            "saving": bill.saving, "example_prices": bill.example_prices}


def total(rows: list[dict]) -> dict:
    """Sums over the runs, of their unrounded figures (one run's total is its row); a money figure is unknown if any
    run's is."""
    def known_sum(key: str) -> float | None:
        values = [r[key] for r in rows]
        return None if None in values else sum(values)

    usd, on_demand, tokens = known_sum("usd"), known_sum("on_demand_usd"), known_sum("tokens")
    return {"runs": len(rows), "tokens": None if tokens is None else int(tokens),
            "wall_s": sum(r["wall_s"] for r in rows),
            "spot_interruptions": sum(r["spot_interruptions"] for r in rows), "usd": usd,
            "usd_per_million_tokens": usd / (tokens / 1e6) if usd is not None and tokens else None,
            "on_demand_usd": on_demand, "saving": 1 - usd / on_demand if usd is not None and on_demand else None,
            "example_prices": any(r["example_prices"] for r in rows)}


def _rounded(figures: dict) -> dict:
    """As shown: seconds to 0.1 s, the rest (USD, ratios) to 4 decimals."""
    return {key: round(value, 1 if key == "wall_s" else 4) if isinstance(value, float) else value
            for key, value in figures.items()}


def format_text(report: dict) -> str:
    header = ("run", "tokens", "wall", "goodput", "spot int.", "USD", "USD/Mtok", "saving", "endings")
    lines = [_cells(r, r["run"]) for r in report["runs"]]
    runs = report["total"]["runs"]
    lines.append(_cells(report["total"], f"total ({runs} run{'s' * (runs != 1)})"))
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in [header, *lines]]
    if report["total"]["example_prices"]:
        text.append("(example prices)")
    return "\n".join(text)


def _cells(r: dict, name: str) -> tuple[str, ...]:
    def money(value: float | None) -> str:
        return "unknown" if value is None else f"{value:,.2f}"

    saving = "unknown" if r["saving"] is None else f"{100 * r['saving']:.1f}%"
    goodput_cell = f"{100 * r['goodput']:.1f}%" if "goodput" in r else "-"
    tokens = "unknown" if r["tokens"] is None else f"{r['tokens']:,}"
    endings = ", ".join(f"{kind} {count}" for kind, count in sorted(Counter(r.get("endings", [])).items()))
    return (name, tokens, f"{r['wall_s'] / 3600:,.2f} h", goodput_cell, str(r["spot_interruptions"]),
            money(r["usd"]), money(r["usd_per_million_tokens"]), saving, endings or "-")
