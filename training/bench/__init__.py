"""``spotray bench ...``: benchmarks that print JSON; results are recorded in BENCHMARKS.md."""

from __future__ import annotations

import argparse


def run_bench(which: str, args: argparse.Namespace) -> dict:
    if which == "checkpoint":
        from training.bench.checkpoint import run

        storages = [s.strip() for s in args.storage.split(",") if s.strip()]
        return run(storages, s3_endpoint=args.s3_endpoint, repeats=args.steps or 3, preset=args.preset)
    if which == "recovery":
        from training.bench.recovery import run

        return run(preset=args.preset, rounds=args.rounds)
    from training.bench.throughput import run

    return run(steps=args.steps or 20, preset=args.preset, workers=args.workers)
