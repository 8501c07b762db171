"""``spotray bench ...``: benchmarks that print JSON; results are recorded in BENCHMARKS.md."""

from __future__ import annotations

import argparse

from spotray.errors import SpotrayError

DEFAULT_STORAGES = "local,s3"  # of the checkpoint and recovery benches; with --script, s3


def run_bench(which: str, args: argparse.Namespace) -> dict:
    if getattr(args, "script", False):
        if which != "recovery":
            raise SpotrayError(f"--script: only with `bench recovery`, not `bench {which}`")
        from spotray.bench.recovery_script import run as run_recovery_script

        return run_recovery_script(_storages(args.storage or "s3"), s3_endpoint=args.s3_endpoint, preset=args.preset,
                                   rounds=args.rounds, every=args.steps or 5, fault=args.fault, **_gap(args))
    if which == "checkpoint":
        from spotray.bench.checkpoint import run as run_checkpoint

        return run_checkpoint(_storages(args.storage or DEFAULT_STORAGES), s3_endpoint=args.s3_endpoint,
                              repeats=args.steps or 3, preset=args.preset)
    if which == "recovery":
        from spotray.bench.recovery import run as run_recovery

        return run_recovery(_storages(args.storage or DEFAULT_STORAGES), s3_endpoint=args.s3_endpoint,
                            preset=args.preset, rounds=args.rounds, every=args.steps or 5, fault=args.fault,
                            **_gap(args))
    if which == "pretrained":
        from spotray.bench.pretrained import run as run_pretrained

        return run_pretrained(preset=args.preset, s3_endpoint=args.s3_endpoint)
    if which == "prepare":
        from spotray.bench.prepare import run as run_prepare

        return run_prepare(size_mb=args.size_mb, s3_endpoint=args.s3_endpoint, rounds=args.rounds)
    if which == "goodput":
        from spotray.bench.goodput import run as run_goodput

        if args.faults == "kill":
            return run_goodput(steps=args.steps or 10000, rounds=args.rounds, faults="kill",
                               kills=_one_count(args.kills or "4"), **_gap(args))
        return run_goodput(steps=args.steps or 6000, rounds=args.rounds, faults=args.faults or "demo")
    if which == "export":
        from spotray.bench.export import run as run_export

        return run_export(preset=args.preset)
    if which == "soak":
        from spotray.bench.soak import run as run_soak

        return run_soak(minutes=args.minutes, seed=args.seed, faults=_one_count(args.faults or "10", "--faults"))
    if which == "planner":
        from spotray.bench.planner import run as run_planner

        return run_planner(steps=args.steps or 1800, kills=_counts(args.kills or "1,2,4"), rounds=args.rounds)
    if which == "compile":
        from spotray.bench.compile import run as run_compile

        return run_compile(preset=args.preset, rounds=args.rounds, workers=args.workers, gpu=args.gpu)
    if which == "tracking":
        from spotray.bench.tracking import run as run_tracking

        return run_tracking(steps=args.steps or 60, rounds=args.rounds, preset=args.preset, workers=args.workers)
    from spotray.bench.throughput import run as run_throughput

    return run_throughput(steps=args.steps or 20, rounds=args.rounds, preset=args.preset, workers=args.workers,
                          gpu=args.gpu, hf_config=args.hf_config, overrides=tuple(args.set),
                          vocab_size=_vocab_size(args.vocab_size))


def _storages(arg: str) -> list[str]:
    storages = [s.strip() for s in arg.split(",") if s.strip()]
    unknown = set(storages) - {"local", "s3"}
    if unknown or not storages:
        raise SpotrayError(f"--storage: unknown {sorted(unknown)}; use a comma-separated list of local, s3")
    return storages


def _gap(args: argparse.Namespace) -> dict:
    if args.capacity_gap is None:
        return {}
    if args.capacity_gap < 0:
        raise SpotrayError(f"--capacity-gap {args.capacity_gap:g}: give 0 or more seconds")
    return {"capacity_gap_s": args.capacity_gap}


def _vocab_size(vocab_size: int | None) -> int | None:
    if vocab_size is not None and not 2 <= vocab_size <= 1 << 32:
        raise SpotrayError(f"--vocab-size {vocab_size}: give a vocabulary of 2 to 2**32 tokens, e.g. 50257 (GPT-2's)")
    return vocab_size


def _counts(arg: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(c) for c in arg.split(",") if c.strip())
    except ValueError:
        counts = ()
    if not counts:
        raise SpotrayError(f"--kills {arg!r}: give counts of kills per drill, comma-separated, e.g. 1,2,4")
    return counts


def _one_count(arg: str, flag: str = "--kills") -> int:
    if not arg.strip().isdigit():
        raise SpotrayError(f"{flag} {arg!r}: give one whole number, e.g. 4")
    return int(arg)
