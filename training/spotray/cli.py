"""The ``spotray`` command line (its console script): ``prepare``, ``train``, ``status``, ``cost``, ``prices``,
``estimate``, ``export``, ``demo``, ``bench``; and the Pulumi program's verbs, ``plan``, ``render``, ``pulumi-env``
and ``submit``, which it hands to the program's own command line (``infra/cli.py``) in the clone at
``--project-dir`` (default: the current directory), as ``pulumi`` finds ``Pulumi.yaml``: that program is not part of
the installed package, so it is imported from there by name.

It imports nothing of the provisioning side otherwise, so it runs in the training image, which has no Pulumi; each
command imports what it needs only when it runs (``cost``, ``prices`` and ``estimate`` declare their arguments in
modules light enough to import for that)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from spotray.accounts import aws_prices
from spotray.data import FORMATS
from spotray.errors import SpotrayError
from spotray.planning import estimate
from spotray.reports import cost_report


def _cmd_prepare(args: argparse.Namespace) -> None:
    import time

    from spotray.data.executors import RayExecutor
    from spotray.data.prepare import describe, prepare, verify
    from spotray.storage import StorageOptions

    options = StorageOptions(endpoint_url=args.endpoint_url)
    if args.verify:
        if args.input or args.output:
            raise SpotrayError("prepare --verify URL checks a prepared dataset: give it without --input/--output")
        result = verify(args.verify, options)
        val = result.get("val")
        and_val = (f" and {val['shards']} validation shards ({val['tokens']:,} tokens, {val['bytes'] / 1e6:,.1f} MB)"
                   if val else "")
        print(f"verified {result['shards']} shards ({result['tokens']:,} tokens, {result['bytes'] / 1e6:,.1f} MB)"
              f"{and_val} at {args.verify}: sizes and SHA-256s match the index")
        return
    if not args.input or not args.output:
        raise SpotrayError("prepare needs --input (repeatable) and --output; or --verify URL to check a dataset")
    started = time.monotonic()
    given = {"chunk_mb": args.chunk_mb, "shard_tokens": args.shard_tokens}
    index = prepare(args.input, args.output, options, RayExecutor(args.parallelism), tokenizer=args.tokenizer,
                    format=args.format, text_field=args.text_field, min_chars=args.min_chars, dedup=args.dedup,
                    skip_bad_lines=args.skip_bad_lines, val_fraction=args.val_fraction,
                    **{k: v for k, v in given.items() if v is not None})
    print(describe(index, time.monotonic() - started, args.output))


def _number_or_text(text: str) -> float | str:
    """A number, or the text as given: ``PrepareSettings`` then names a bad value in one line, where argparse
    would print its usage too."""
    try:
        return float(text)
    except ValueError:
        return text


def _without_script(args: argparse.Namespace) -> str:
    """What to write instead of positional arguments (or ``--debug``) given to ``train`` without ``--script``."""
    needs_a_script = "only with --script FILE (a script's arguments follow `--script FILE --`)"
    if args.debug:
        return f"--debug: {needs_a_script}"
    first = args.script_args[0]
    if first.endswith((".yaml", ".yml")):
        return f"{first}: give a config file with --config {first}"
    if first.endswith(".py"):
        return f"{first}: run a script with --script {first} (its arguments after --)"
    return f"the arguments {' '.join(args.script_args)}: {needs_a_script}"


def _cmd_train(args: argparse.Namespace) -> None:
    from spotray import config

    overrides = list(args.set or [])
    if args.audit_dir:
        overrides.append(f"audit_dir={args.audit_dir}")
    if (args.script_args or args.debug) and not args.script:
        raise SpotrayError(_without_script(args))
    script = {"script": {"path": args.script, "args": args.script_args, "debug": args.debug}} if args.script else {}
    cfg = config.load(args.config, overrides, base=script)
    if args.script:
        from spotray.worker.user_script import with_script

        cfg = with_script(cfg, args.script)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # the log file keeps every rank's lines, as they come
    from spotray.driver import launch  # Ray and torch load only once the config is known to be valid
    from spotray.driver.console import RunConsole
    from spotray.errors import TrainingFailed
    from spotray.worker.user_script import ScriptFailed

    task = launch.preflight(launch.with_absolute_paths(cfg))  # bad data or model: one line, before any log file
    console = RunConsole(launch.log_location(cfg), verbose=args.verbose)
    try:
        with console:
            for line in launch.header(cfg, console.where, args.verbose):
                console.say(line)
            try:
                summary = launch.run(cfg, worker_logs=not args.no_worker_logs, console=console.stream, task=task)
            finally:
                launch.leave_ray()  # inside: Ray's last words go to the log too
    except ScriptFailed as exc:  # rank N: ExceptionType: message
        raise ScriptFailed(f"{exc} (log: {console.where})") from exc
    except TrainingFailed as exc:
        raise TrainingFailed(f"{exc} (the full log: {console.where})") from exc
    if args.summary_json:
        launch.write_summary(summary, args.summary_json)
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k != "losses"}, indent=2))
    else:
        from spotray.reports.summary import format_summary

        print(format_summary(summary))


def _cmd_status(args: argparse.Namespace) -> None:
    from spotray.reports.status import format_text, gather
    from spotray.storage import StorageOptions

    status = gather(args.run_url, StorageOptions(endpoint_url=args.endpoint_url))
    print(json.dumps(status, indent=2) if args.json else format_text(status))


def _cmd_export(args: argparse.Namespace) -> None:
    from spotray.export import export
    from spotray.storage import StorageOptions

    result = export(args.run_url, args.out, step=args.step, best=args.best,
                    options=StorageOptions(endpoint_url=args.endpoint_url),
                    max_shard_bytes=int(args.max_shard_gb * 1024**3), dtype=args.dtype)
    extras = "".join(f" + {name}" for name in result["config"] + result["tokenizer"])
    print(f"exported step {result['step']} to {result['out']} in {result['dtype']}: {', '.join(result['files'])}"
          f"{extras}")


def _cmd_demo(args: argparse.Namespace) -> None:
    from spotray import demo
    from spotray.accounts.cost import money_text
    from spotray.driver.launch import write_summary
    from spotray.reports.summary import format_table

    summary = demo.run(args.workdir, tuple(args.set or ()))
    print(format_table(summary))
    print(f"cost: {money_text(summary['cost'])}")
    print(f"loss curve: {summary['loss_curve_png']}")
    if args.json:
        write_summary({k: v for k, v in summary.items() if k != "losses"}, args.json)


def _command(sub: argparse._SubParsersAction, name: str, commands: ModuleType, help: str) -> None:
    """A command whose module declares its arguments (``add_arguments``) and runs it (``run``)."""
    p = sub.add_parser(name, help=help)
    commands.add_arguments(p)
    p.set_defaults(func=commands.run)


def _cmd_bench(args: argparse.Namespace) -> None:
    from spotray.bench import run_bench

    result = run_bench(args.which, args)
    print(json.dumps(result, indent=2) if args.json else _format_bench(result))


def _format_bench(result: dict) -> str:
    return "\n".join(f"{k}: {v}" for k, v in result.items())


def register(sub: argparse._SubParsersAction) -> None:
    """The training half of the command line: what runs on a laptop or in the training image."""
    p = sub.add_parser("prepare", help="tokenize text, JSONL or Parquet files (local or s3://) into token shards, "
                       "in parallel on Ray; or --verify a prepared dataset")
    p.add_argument("--input", action="append", metavar="URL",
                   help="file, directory, glob ('data/**/*.jsonl.gz') or s3:// prefix or glob; repeatable")
    p.add_argument("--output", metavar="URL", help="local dir or s3://bucket/prefix")
    p.add_argument("--verify", metavar="URL", help="check every shard of the dataset at URL against its index")
    p.add_argument("--tokenizer", default="bytes",
                   help="'bytes' (default), a HF tokenizer.json or a model directory holding one (local or s3://)")
    p.add_argument("--format", default="auto", choices=FORMATS,
                   help="auto (default): by extension (.jsonl/.ndjson/.json, .parquet, else text; .gz/.zst allowed; "
                        "a .json file that begins with '[' is one array of records); json: such an array")
    p.add_argument("--text-field", default="text", help="the JSONL field or Parquet column holding the text")
    p.add_argument("--min-chars", type=int, default=1, help="drop documents shorter than this (default 1)")
    p.add_argument("--no-dedup", dest="dedup", action="store_false",
                   help="keep exact duplicates (default: drop repeats of a document's whitespace-normalised text)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="count and skip JSONL lines that are not JSON objects with the text field, instead of stopping")
    p.add_argument("--parallelism", type=int, default=None, help="tasks at a time (default: the Ray cluster's CPUs)")
    p.add_argument("--chunk-mb", type=float, help="input per task, in MiB (default 16)")
    p.add_argument("--shard-tokens", type=int, help="tokens per shard file (default 1,048,576)")
    p.add_argument("--val-fraction", metavar="F", type=_number_or_text,
                   help="also write a validation dataset at OUTPUT/val: the documents whose text hash falls in this "
                        "fraction (0 < F <= 0.5) of the hash space, none of them in the training split")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO); default: AWS_ENDPOINT_URL")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("train", help="train (or resume) a run on the Ray cluster at RAY_ADDRESS or a local one")
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--summary-json", help="write the run summary here")
    p.add_argument("--audit-dir", help="URL where each rank records the sample ids it trained on")
    p.add_argument("--json", action="store_true", help="print the run's summary as one JSON object on stdout")
    p.add_argument("--verbose", action="store_true",
                   help="show everything on the terminal: Ray's lines and every worker's (default: in the log file)")
    p.add_argument("--no-worker-logs", action="store_true",
                   help="do not collect the workers' output, not even in the log file")
    p.add_argument("--script", metavar="FILE",
                   help="run your own training script on every worker instead of spotray's loop (docs/scripts.md); "
                        "its folder is shipped unless runtime.working_dir is set")
    p.add_argument("--debug", action="store_true",
                   help="with --script: a worker whose script raises waits for Ray's debugger (docs/scripts.md)")
    p.add_argument("script_args", nargs="*", metavar="-- ARG", help="the script's arguments, after --")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("status", help="where a run stands, live or finished: steps, loss, checkpoints, goodput")
    p.add_argument("run_url", metavar="RUN_URL", help="<checkpoint.path>/<run.name>: a local dir, file:// or s3://")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO); default: AWS_ENDPOINT_URL")
    p.set_defaults(func=_cmd_status)

    _command(sub, "cost", cost_report, "what runs cost: tokens, wall time, goodput, USD, USD per million tokens, "
             "saving against on-demand")
    _command(sub, "prices", aws_prices, "fetch spot (per zone, over time) and on-demand prices from AWS into a "
             "prices file a run (cost.prices_file) can name")
    _command(sub, "estimate", estimate, "should this run use spot? expected goodput, wall time and USD on spot and "
             "on-demand, at one or several sizes")

    p = sub.add_parser("export", help="a committed checkpoint as a Hugging Face model directory (safetensors)")
    p.add_argument("run_url", metavar="RUN_URL", help="<checkpoint.path>/<run.name>: a local dir, file:// or s3://")
    p.add_argument("--out", required=True, help="an empty directory (local or s3://) for the model")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="a committed step (default: the newest)")
    which.add_argument("--best", action="store_true",
                       help="the committed checkpoint with the lowest validation loss (checkpoint.keep_best)")
    p.add_argument("--max-shard-gb", type=float, default=2.0, help="split the weights into files of at most this")
    p.add_argument("--dtype", default=None,
                   help="float32, bfloat16 or float16: the weights' type (default: the one the model's config names, "
                        "as a pretrained model came; else float32)")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO); default: AWS_ENDPOINT_URL")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("demo", help="the main job on the embedded default (local Ray, local storage, CPU)")
    p.add_argument("--workdir", default="./spotray-runs", help="where data and checkpoints go")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key of the demo config")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("bench", help="benchmarks (JSON with --json)")
    p.add_argument("which", choices=["checkpoint", "throughput", "recovery", "pretrained", "export", "prepare",
                                     "goodput", "tracking", "soak", "planner", "compile"])
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--storage", default=None,
                   help="checkpoint, recovery benches: any of local,s3 (default: both; recovery --script: s3)")
    p.add_argument("--s3-endpoint", help="S3 endpoint to benchmark (default: a moto server on loopback)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (throughput, goodput, tracking), saves (checkpoint), or the checkpoint "
                        "interval (recovery)")
    p.add_argument("--workers", type=int, default=2,
                   help="throughput, tracking benches: processes on each side; compile bench: the run's ranks")
    p.add_argument("--preset", default="small", help="model preset to benchmark (default: small, 130 MB of state)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="throughput bench: a config override for both sides, which the bare loop ignores where it has "
                        "no such feature (e.g. snapshot.every_steps=auto); repeatable")
    p.add_argument("--hf-config", default=None,
                   help="throughput bench: a Transformers config.json URL, or its JSON, to benchmark instead")
    p.add_argument("--rounds", type=int, default=2,
                   help="throughput, recovery, prepare, goodput, tracking, compile benches: runs per side, "
                        "interleaved; planner bench: drills per count of kills")
    p.add_argument("--gpu", action="store_true",
                   help="throughput bench: one GPU per worker (NCCL, bf16), reporting tokens/s and MFU; compile "
                        "bench: the ranks on GPUs (NCCL, bf16)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="throughput bench: train on random token ids below this (e.g. 50257, GPT-2's vocabulary) "
                        "instead of the byte-level text corpus")
    p.add_argument("--size-mb", type=int, default=1024, help="prepare bench: MiB of generated JSONL (default 1024)")
    p.add_argument("--fault", choices=["kill", "notice", "both", "shrink"], default="kill",
                   help="recovery bench: kill (spotray against plain Ray Train, timed from the replacement node), "
                        "notice (spotray's recovery from a notice against from a kill, timed from the fault), both, "
                        "or shrink (a kill with scaling.min_workers against without, timed from the fault)")
    p.add_argument("--capacity-gap", type=float, default=None, metavar="SECONDS",
                   help="recovery bench: how long the cluster stays a node short after a compared kill, before the "
                        "replacement starts (default 10: Ray has noticed the loss and waits for capacity); goodput "
                        "bench --faults kill: after each kill (default 60)")
    p.add_argument("--minutes", type=float, default=20, help="soak bench: how long its schedule of faults runs")
    p.add_argument("--seed", type=int, default=0, help="soak bench: the seed of its fault schedule")
    p.add_argument("--kills", default=None,
                   help="planner bench: kills per drill, one drill per count and round (default 1,2,4; one count "
                        "must be 3 or more); goodput bench --faults kill: kills in its schedule (default 4)")
    p.add_argument("--faults", default=None,
                   help="soak bench: how many faults its schedule holds (default 10; at least one of each kind: 7); "
                        "goodput bench: demo (the demo's notice and kill, against waiting for the draining node; the "
                        "default) or kill (a schedule of --kills kills, snapshots and going on with the survivor "
                        "against neither)")
    p.add_argument("--script", action="store_true",
                   help="recovery bench: a Hugging Face Trainer script (spotray train --script) against the same "
                        "script with Ray's RayTrainReportCallback, on S3 (--storage s3, --fault kill)")
    p.set_defaults(func=_cmd_bench)


# The Pulumi program's verbs (infra/cli.py registers them), with what `spotray --help` says of each.
PROGRAM_VERBS = {"plan": "offline preview of a stack (the Pulumi program in --project-dir)",
                 "render": "a stack's Kubernetes objects as YAML files for GitOps (the program in --project-dir)",
                 "pulumi-env": "a stack's Pulumi state backend, for CI (the program in --project-dir)",
                 "submit": "submit a training RayJob to a stack's cluster (the program in --project-dir)"}


def _program_cli(argv: list[str]):
    """The command line of the Pulumi program in the clone at ``--project-dir``; None where there is none and
    ``--help`` was asked for (printed here)."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--project-dir", default=".")
    project = Path(where.parse_known_args(argv[1:])[0].project_dir).resolve()
    if not ((project / "Pulumi.yaml").is_file() and (project / "infra" / "cli.py").is_file()):
        if {"-h", "--help"} & set(argv[1:]):
            print(f"usage: spotray {argv[0]} [--project-dir CLONE] ...\n\n{PROGRAM_VERBS[argv[0]]}. Its options "
                  f"are the program's: run `spotray {argv[0]} --help` in a clone of spotray's repository, or give "
                  "--project-dir, to see them.")
            return None
        raise SpotrayError(f"spotray {argv[0]} runs the Pulumi program of a clone of spotray's repository, and "
                           f"{project} holds none (no Pulumi.yaml and infra/): run it in the clone, or give "
                           "--project-dir")
    sys.path.insert(0, str(project))
    return importlib.import_module("infra.cli")


def main(argv: list[str] | None = None, *halves: Callable[[argparse._SubParsersAction], None]) -> int:
    """Runs one command; ``halves`` register more commands beside the training ones (the Pulumi program's command
    line adds its verbs: ``infra/cli.py``)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not halves and argv[:1] and argv[0] in PROGRAM_VERBS:
            program = _program_cli(argv)
            return program.main(argv) if program else 0
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
        logging.getLogger("botocore").setLevel(logging.WARNING)  # "Found credentials in ...": not a line for the user
        parser = argparse.ArgumentParser(prog="spotray", description="Train on GPU spot capacity with Ray.")
        sub = parser.add_subparsers(dest="command", required=True)
        for register_half in (register, *halves):
            register_half(sub)
        for verb, summary in PROGRAM_VERBS.items() if not halves else ():
            sub.add_parser(verb, help=summary)
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's own parser, whose usage names what it takes
            sub.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
        args.func(args)
    except SpotrayError as exc:
        print(f"spotray: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("spotray: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
