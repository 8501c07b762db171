"""The ``spotray`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from training.errors import SpotrayError


def _cmd_prepare(args: argparse.Namespace) -> None:
    from training.data.prepare import prepare
    from training.storage import StorageOptions

    index = prepare(args.input, args.output, tokenizer=args.tokenizer, shard_tokens=args.shard_tokens,
                    options=StorageOptions(endpoint_url=args.endpoint_url))
    print(f"prepared {index['total_tokens']:,} tokens from {index['num_documents']:,} documents "
          f"into {len(index['shards'])} shards at {args.output}")


def _cmd_train(args: argparse.Namespace) -> None:
    from training import config

    overrides = list(args.set or [])
    if args.audit_dir:
        overrides.append(f"audit_dir={args.audit_dir}")
    cfg = config.load(args.config, overrides)
    from training import launch  # Ray and torch load only once the config is known to be valid

    summary = launch.run(cfg, worker_logs=not args.no_worker_logs)
    _print_summary(summary)
    if args.summary_json:
        launch.write_summary(summary, args.summary_json)


def _cmd_demo(args: argparse.Namespace) -> None:
    from training import demo
    from training.launch import write_summary
    from training.report import format_table

    summary = demo.run(args.workdir, tuple(args.set or ()))
    print(format_table(summary))
    print(f"loss curve: {summary['loss_curve_png']}")
    if args.json:
        write_summary({k: v for k, v in summary.items() if k != "losses"}, args.json)


def _require_infra(command: str) -> None:
    try:
        import pulumi  # noqa: F401
        import pulumi_kubernetes  # noqa: F401
    except ImportError as exc:
        raise SpotrayError(f"spotray {command} needs the Pulumi SDKs ({exc.name} is missing): "
                           "pip install 'spotray[infra]'") from exc


def _cmd_plan(args: argparse.Namespace) -> None:
    from pathlib import Path

    _require_infra("plan")
    from infra.config import load_stack_file
    from infra.plan import PolicyViolations, format_plan, plan

    cfg = load_stack_file(Path(args.project_dir), args.stack)
    result = plan(cfg)
    print(json.dumps(result.to_dict(cfg.environment), indent=2) if args.json else format_plan(result, cfg.environment))
    found = result.violations(cfg.environment)
    if found:
        raise PolicyViolations(f"stack {args.stack} breaks {len(found)} polic(ies): {', '.join(found)}")


def _cmd_render(args: argparse.Namespace) -> None:
    from pathlib import Path

    _require_infra("render")
    from cluster.render import render, write
    from infra.config import load_stack_file

    rendered = render(load_stack_file(Path(args.project_dir), args.stack))
    write(rendered, Path(args.out))
    print(f"rendered {len(rendered.objects)} objects and {len(rendered.releases)} Helm releases of stack "
          f"{args.stack} into {args.out}; {len(rendered.secrets)} Secrets to provide: {args.out}/required-secrets.yaml")


def _cmd_submit(args: argparse.Namespace) -> None:
    from pathlib import Path

    from cluster.submit import submit
    from infra.config import load_stack_file
    from training import config

    train = config.load(args.config, list(args.set or []))
    stack = load_stack_file(Path(args.project_dir), args.stack)
    print(submit(train, stack, image=args.image, gpu_pool=args.gpu_pool, context=args.context, dry_run=args.dry_run))


def _cmd_bench(args: argparse.Namespace) -> None:
    from training.bench import run_bench

    result = run_bench(args.which, args)
    print(json.dumps(result, indent=2) if args.json else _format_bench(result))


def _format_bench(result: dict) -> str:
    return "\n".join(f"{k}: {v}" for k, v in result.items())


def _print_summary(summary: dict) -> None:
    shown = {k: v for k, v in summary.items() if k != "losses"}
    print(json.dumps(shown, indent=2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotray", description="Train on GPU spot capacity with Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="tokenize text files into token shards + index.json")
    p.add_argument("--input", required=True, help="file, directory or glob of text files")
    p.add_argument("--output", required=True, help="local dir or s3://bucket/prefix")
    p.add_argument("--tokenizer", default="bytes", help="'bytes' (default) or a path to a HF tokenizer.json")
    p.add_argument("--shard-tokens", type=int, default=1 << 20)
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO); default: AWS_ENDPOINT_URL")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("train", help="train (or resume) a run on the Ray cluster at RAY_ADDRESS or a local one")
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--summary-json", help="write the run summary here")
    p.add_argument("--audit-dir", help="URL where each rank records the sample ids it trained on")
    p.add_argument("--no-worker-logs", action="store_true",
                   help="do not stream the workers' logs here (progress and interruption lines still show)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("demo", help="the main job on the embedded default (local Ray, local storage, CPU)")
    p.add_argument("--workdir", default="./spotray-runs", help="where data and checkpoints go")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key of the demo config")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("plan", help="offline preview: every resource `pulumi up` would create for a stack")
    p.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--project-dir", default=".", help="directory of Pulumi.yaml (default: current)")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("render", help="offline: the stack's Kubernetes objects as YAML files for GitOps")
    p.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    p.add_argument("--out", required=True, help="directory to write (new, empty, or an earlier render)")
    p.add_argument("--project-dir", default=".", help="directory of Pulumi.yaml (default: current)")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("submit", help="submit a training RayJob to the current kube-context (kubectl)")
    p.add_argument("--stack", required=True, help="the stack whose cluster it runs on: pools, storage, image")
    p.add_argument("--config", required=True, help="training YAML config file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--image", help="training image with its tag (default: the stack's training.image)")
    p.add_argument("--gpu-pool", help="spotray.dev/pool of the GPU nodes (default: the stack's training.gpuPool)")
    p.add_argument("--context", help="kube-context (default: the current one)")
    p.add_argument("--dry-run", action="store_true", help="print the manifests instead of applying them")
    p.add_argument("--project-dir", default=".", help="directory of Pulumi.yaml (default: current)")
    p.set_defaults(func=_cmd_submit)

    p = sub.add_parser("bench", help="benchmarks (JSON with --json)")
    p.add_argument("which", choices=["checkpoint", "throughput", "recovery"])
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--storage", default="local,s3", help="checkpoint, recovery benches: any of local,s3")
    p.add_argument("--s3-endpoint", help="S3 endpoint to benchmark (default: a moto server on loopback)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (throughput), saves (checkpoint), or the checkpoint interval (recovery)")
    p.add_argument("--workers", type=int, default=2, help="throughput bench: processes on each side")
    p.add_argument("--preset", default="small", help="model preset to benchmark (default: small, 130 MB of state)")
    p.add_argument("--rounds", type=int, default=2, help="recovery bench: drills per side, interleaved")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
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
