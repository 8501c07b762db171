"""``spotray estimate``: the command: its flags, read into the planner's inputs, and the table or JSON it prints."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from spotray.errors import SpotrayError
from spotray.planning.planner import BENCH_SOURCE, Inputs, Plan, _flag, defaults_used, plan, save_times, snapshot_time

if TYPE_CHECKING:  # the CLI imports this module to register the command: the ledger's pyarrow waits for --from
    from spotray.planning.calibration import Measured

_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``spotray estimate``'s flags. Numbers are read by ``run``, so that a bad one is one line, exit 2."""
    parser.add_argument("--from", dest="from_url", metavar="RUN_URL",
                        help="take step, save, restore and restart times, tokens per step, nodes and its "
                             "interruptions from a run's ledger; flags given override them")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO) for --from")
    size = parser.add_argument_group("the run")
    size.add_argument("--tokens", help="tokens to train (K, M, B or T suffixes: 1T)")
    size.add_argument("--steps", help="or steps to train, of --tokens-per-step each")
    size.add_argument("--tokens-per-step", help="the global batch in tokens (fixed across sizes)")
    size.add_argument("--step-s", help="seconds per step, measured on --step-nodes nodes")
    size.add_argument("--step-nodes", help="nodes --step-s was measured on (default: the first --nodes)")
    size.add_argument("--nodes", help="cluster sizes to plan, in nodes: 8,64,512 (default: 1, or the run's)")
    size.add_argument("--overhead-s-per-step", help="wall seconds per step outside it: evaluation, logging")
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--every-steps", help="a fixed checkpoint interval, or auto (default; with --from: the run's)")
    ckpt.add_argument("--blocking-save-s", help="seconds a save blocks training")
    ckpt.add_argument("--save-s", help="seconds a whole save takes, end to end")
    ckpt.add_argument("--restore-s", help="seconds a restore takes")
    ckpt.add_argument("--async-save", action="store_true", help="saves are asynchronous (checkpoint.async: true)")
    ckpt.add_argument("--checkpoint-gb", help="checkpoint size in GB (e.g. params x 16 bytes with Adam)")
    ckpt.add_argument("--storage-gb-s", help="storage bandwidth per node in GB/s (save and restore scale with it)")
    faults = parser.add_argument_group("interruptions and recovery")
    faults.add_argument("--interruptions-per-node-hour", help="the spot pool's interruption rate per node-hour")
    faults.add_argument("--interruptions", help="or a count of interruptions for the whole run (one size)")
    faults.add_argument("--on-demand-interruptions-per-node-hour",
                        help="hardware failures on on-demand nodes (default 0)")
    faults.add_argument("--restart-s", help="seconds from an interruption to training again: capacity + start-up")
    faults.add_argument("--startup-s", help="seconds to the run's first step (default: --restart-s)")
    faults.add_argument("--capacity-wait-s", help="the part of --restart-s spent waiting for a replacement node")
    faults.add_argument("--warm-spare-restart-s", help="--restart-s when a warm spare takes over "
                                                       "(default: restart less capacity wait)")
    faults.add_argument("--warm-spares", help="idle spot nodes held for the run (billed on the spot rows)")
    faults.add_argument("--notice-share", help="share of interruptions whose notice leaves time for a save (0-1)")
    faults.add_argument("--shrink", action="store_true",
                        help="go on with the survivors (scaling.min_workers) instead of waiting for a replacement")
    snapshots = parser.add_argument_group("in-memory snapshots (snapshot.every_steps)")
    snapshots.add_argument("--snapshot-s", help="seconds a snapshot blocks training (default: no snapshots)")
    snapshots.add_argument("--snapshot-every-steps", help="steps between snapshots, or auto (default)")
    prices = parser.add_argument_group("prices (USD per node-hour)")
    prices.add_argument("--spot-price", help="spot price of one node per hour")
    prices.add_argument("--on-demand-price", help="on-demand price of one node per hour")
    prices.add_argument("--warm-spare-price", help="price of a warm spare per hour (default: the row's price)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


_NUMBERS = {  # flag destination -> (Inputs field, parser)
    "tokens": ("tokens", "tokens"), "steps": ("steps", "int"), "tokens_per_step": ("tokens_per_step", "tokens"),
    "step_s": ("step_s", "float"), "step_nodes": ("step_nodes", "int"),
    "overhead_s_per_step": ("overhead_s_per_step", "float"), "blocking_save_s": ("blocking_save_s", "float"),
    "save_s": ("save_s", "float"), "restore_s": ("restore_s", "float"),
    "checkpoint_gb": ("checkpoint_bytes", "gb"), "storage_gb_s": ("storage_bytes_per_s", "gb"),
    "interruptions_per_node_hour": ("interruptions_per_node_hour", "float"),
    "interruptions": ("interruptions", "int"),
    "on_demand_interruptions_per_node_hour": ("on_demand_interruptions_per_node_hour", "float"),
    "restart_s": ("restart_s", "float"), "startup_s": ("startup_s", "float"),
    "capacity_wait_s": ("capacity_wait_s", "float"), "warm_spare_restart_s": ("warm_spare_restart_s", "float"),
    "warm_spares": ("warm_spares", "int"), "notice_share": ("notice_share", "float"),
    "snapshot_s": ("snapshot_s", "float"),
    "spot_price": ("spot_price", "float"), "on_demand_price": ("on_demand_price", "float"),
    "warm_spare_price": ("warm_spare_price", "float"),
}
_REQUIRED = {  # the inputs a plan cannot go without: what each is, and where a user finds it
    "step_s": ("--step-s", "seconds per training step", "give it, or --from RUN_URL"),
    "tokens_per_step": ("--tokens-per-step", "the global batch in tokens", "give it, or --from RUN_URL"),
    "restart_s": ("--restart-s", "seconds from an interruption to training again (replacement capacity + start-up)",
                  "give it, or --from RUN_URL of an interrupted run"),
}
_RATE = ("--interruptions-per-node-hour", "the spot pool's interruptions per node-hour",
         "e.g. 0.001 (the pool's history, or spotray status of a run on it)")
_SIZE = ("--tokens", "the run's size in tokens", "e.g. --tokens 1T, or --steps N")


def _number(flag: str, text: str, kind: str) -> float | int:
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "gb":
            return float(text) * 1e9
        match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKmMbBgGtT]?)\s*", text)
        if not match:
            raise ValueError(text)
        return float(match.group(1)) * _SUFFIXES[match.group(2).lower()]
    except ValueError:
        what, example = {"int": ("a whole number", "8"), "float": ("a number", "0.5"), "gb": ("a number of GB", "112"),
                         "tokens": ("a number of tokens", "1T or 4M")}[kind]
        raise SpotrayError(f"{flag}: {text!r} is not {what}; give e.g. {flag} {example}") from None


def inputs_from_args(args: argparse.Namespace) -> tuple[Inputs, Measured | None]:
    """The flags over what ``--from`` measured."""
    given: dict[str, Any] = {}
    for dest, (name, kind) in _NUMBERS.items():
        text = getattr(args, dest, None)
        if text is not None:
            given[name] = _number(_flag(dest), text, kind)
    if getattr(args, "nodes", None):
        try:
            given["nodes"] = tuple(int(n) for n in args.nodes.split(","))
        except ValueError:
            raise SpotrayError(f"--nodes: {args.nodes!r} is not a list of node counts; e.g. --nodes 8,64,512") from None
    every = getattr(args, "every_steps", None)
    if every is not None:
        given["every_steps"] = None if every == "auto" else _number("--every-steps", every, "int")
    snapshot_every = getattr(args, "snapshot_every_steps", None)
    if snapshot_every is not None and snapshot_every != "auto":
        given["snapshot_every_steps"] = _number("--snapshot-every-steps", snapshot_every, "int")
    for flag in ("async_save", "shrink"):
        if getattr(args, flag, False):
            given[flag] = True
    measured = None
    values: dict[str, Any] = {}
    if getattr(args, "from_url", None):
        run_every = given.get("every_steps")
        from spotray.planning.calibration import inputs_from_run
        from spotray.storage import StorageOptions

        measured = inputs_from_run(args.from_url, StorageOptions(endpoint_url=args.endpoint_url), run_every)
        values = dict(measured.values)
        if "checkpoint_bytes" in given or "storage_bytes_per_s" in given:  # the bandwidth rule over measured times
            for name in ("blocking_save_s", "save_s", "restore_s"):
                values.pop(name, None)
        # The run's count of interruptions replays that run alone: another size or length needs a rate.
        other_run = ("nodes" in given and given["nodes"] != values["nodes"] or "tokens" in given
                     or given.get("steps", values["steps"]) != values["steps"])
        if "interruptions_per_node_hour" in given or other_run:
            values.pop("interruptions", None)
        if "steps" not in given and "tokens" in given:
            values.pop("steps", None)
        for name, why in measured.unknown.items():
            if name not in given:
                raise SpotrayError(f"--from {args.from_url}: {why}")
    merged = {**values, **given}
    _require_all(merged, measured is not None)
    if "interruptions_per_node_hour" not in merged and "interruptions" not in merged and measured:
        merged["interruptions_per_node_hour"] = _observed_rate(measured)
    known = {f.name for f in fields(Inputs)}
    return Inputs(**{k: v for k, v in merged.items() if k in known}), measured


def _require_all(merged: dict[str, Any], measured: bool) -> None:
    """Every required input missing, named in one line, so that a plan is not found out one flag at a time."""
    missing = [required for name, required in _REQUIRED.items() if name not in merged]
    if not measured:
        missing += [_RATE] if {"interruptions_per_node_hour", "interruptions"}.isdisjoint(merged) else []
        missing += [_SIZE] if {"tokens", "steps"}.isdisjoint(merged) else []
    if len(missing) == 1:
        [(flag, what, fix)] = missing
        raise SpotrayError(f"{flag}: is required: {what}; {fix}")
    if missing:
        raise SpotrayError(f"{', '.join(flag for flag, _, _ in missing)}: are required ("
                           + "; ".join(f"{flag}: {what}" for flag, what, _ in missing) + "); give them, or --from "
                           "RUN_URL of an interrupted run, whose ledger measures the step, batch and restart")


def _observed_rate(measured: Measured) -> float:
    """The rate the run saw, once ``cost``'s rule trusts it; else one line asking for the pool's."""
    from spotray.accounts.cost import TRUSTED_INTERRUPTIONS, TRUSTED_NODE_HOURS

    bill = measured.bill
    assert bill is not None  # inputs_from_run's
    rate = bill.interruptions_per_node_hour
    if bill.rate_trusted and rate is not None:  # trusted: some node-hours
        return rate
    seen = f" ({rate:.3g} per node-hour)" if rate is not None else ""
    nodes = measured.values["nodes"][0]
    raise SpotrayError(f"--interruptions-per-node-hour: is required to plan another size or length than the run's "
                       f"({nodes} node{'s' if nodes != 1 else ''}, {measured.values['steps']:,} steps); the run saw "
                       f"{bill.nodes_interrupted} spot nodes interrupted in {bill.node_hours:.2f} node-hours{seen}, "
                       "trusted only from "
                       f"{TRUSTED_INTERRUPTIONS} nodes interrupted and {TRUSTED_NODE_HOURS:g} node-hours: give the "
                       "pool's rate")


def run(args: argparse.Namespace) -> None:
    inputs, measured = inputs_from_args(args)
    plans = plan(inputs)
    if getattr(args, "json", False):
        report = {"inputs": _inputs_dict(inputs), "plans": [p.to_dict() for p in plans],
                  "defaults": defaults_used(inputs)}
        if measured:
            assert measured.bill is not None  # inputs_from_run's
            report["measured"] = {"url": measured.url, "goodput": round(measured.goodput, 4),
                                  "wall_s": round(measured.wall_s, 1), "node_hours": round(measured.bill.node_hours, 3)}
        print(json.dumps(report, indent=1, sort_keys=True))
        return
    print(render(inputs, plans, measured))


def _inputs_dict(inputs: Inputs) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(inputs).items()}


def render(inputs: Inputs, plans: list[Plan], measured: Measured | None = None) -> str:
    """The text table: a row per size and capacity type, then the inputs it assumed."""
    header = ("nodes", "capacity", "goodput", "wall", "interruptions", "ckpt every", "dollars", "$/Mtok",
              "vs on-demand", "warm spare")
    rows = [header]
    by_size = {(p.nodes, p.capacity): p for p in plans}
    for p in plans:
        other = by_size.get((p.nodes, "on-demand"))
        saving = (_saving(p.usd, other.usd) if p.capacity == "spot" and p.usd is not None and other
                  and other.usd else "")
        rows.append((str(p.nodes), p.capacity, f"{p.goodput:.1%}" if p.wall_s else "never ends",
                     _duration(p.wall_s), "" if p.expected_interruptions is None else f"{p.expected_interruptions:.1f}",
                     _interval(p, inputs), _usd(p.usd),
                     "unknown" if p.usd_per_mtok is None else f"${p.usd_per_mtok:.4g}", saving, _verdict(p)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    p0 = plans[0]
    lines.append("")
    lines.append(f"run: {p0.steps:,} steps x {inputs.tokens_per_step:,.0f} tokens = {p0.tokens:,.0f} tokens; a step "
                 f"{inputs.step_s:g} s on {inputs.reference_nodes} node(s) (ideal scaling), "
                 f"+{inputs.overhead_s_per_step:g} s overhead")
    for nodes in inputs.nodes:
        blocking, save, restore = save_times(inputs, nodes)
        snapshot = next((p.snapshot_interval_steps for p in plans if p.nodes == nodes), None)
        lines.append(f"{nodes} node{'s' if nodes != 1 else ''}: a save blocks {blocking:.3g} s of {save:.3g} s, "
                     f"restore {restore:.3g} s"
                     + ("" if snapshot is None else f"; a snapshot every {snapshot:,} steps, blocking "
                        f"{snapshot_time(inputs, nodes):.3g} s"))
    rate = (f"{inputs.interruptions} in the whole run" if inputs.interruptions is not None
            else f"{inputs.interruptions_per_node_hour:g} per node-hour")
    spare = inputs.spare_restart_s
    lines.append(f"interruptions: spot {rate}, on-demand {inputs.on_demand_interruptions_per_node_hour:g} per "
                 f"node-hour; restart {inputs.restart_s:.4g} s"
                 + (f" ({spare:.4g} s with a warm spare" + (" or on the survivors" if inputs.shrink else "") + ")"
                    if spare is not None else "")
                 + f"; notice share {inputs.notice_share:g}")
    lines.append(f"prices per node-hour: spot {_usd(inputs.spot_price)}, on-demand {_usd(inputs.on_demand_price)}"
                 + (f"; {inputs.warm_spares} warm spare(s) billed on spot" if inputs.warm_spares else ""))
    if measured:
        lines.append(f"measured from {measured.url}: goodput {measured.goodput:.1%} over {_duration(measured.wall_s)}")
    defaults = defaults_used(inputs)
    if defaults:
        lines.append(f"defaults from {BENCH_SOURCE}, not your cluster's: {'; '.join(defaults)}")
    return "\n".join(lines)


def _interval(p: Plan, inputs: Inputs) -> str:
    if inputs.every_steps is None and p.interval_steps >= p.steps:
        return "at the end"
    return f"{p.interval_steps:,} steps ({_duration(p.interval_steps * p.step_s)})"


def _saving(spot_usd: float, on_demand_usd: float) -> str:
    saving = 1 - spot_usd / on_demand_usd
    return f"saves {saving:.0%}" if saving >= 0 else f"costs {-saving:.0%} more"


def _verdict(p: Plan) -> str:
    spare = p.warm_spare
    if spare is None:
        return "n/a" if not p.expected_interruptions else "give --capacity-wait-s"
    if spare.pays is None:
        return "unknown price"
    word = "pays" if spare.pays else "does not pay"
    return f"{word} ({_usd(spare.idle_usd)} idle, saves {_usd(spare.saves_usd)})"


def _usd(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


__all__ = ["add_arguments", "inputs_from_args", "render", "run"]
