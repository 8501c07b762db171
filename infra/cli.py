"""The Pulumi program's command line: ``plan``, ``render``, ``pulumi-env``, ``submit``, beside the training commands
(``training/spotray/cli.py``, the ``spotray`` console script, which hands these verbs here from the clone at
``--project-dir``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spotray import cli as training_cli
from spotray.errors import SpotrayError


def _require_pulumi(command: str) -> None:
    try:
        import pulumi  # noqa: F401
        import pulumi_kubernetes  # noqa: F401
    except ImportError as exc:
        raise SpotrayError(f"spotray {command} needs the Pulumi SDKs ({exc.name} is missing): "
                           "pip install 'spotray[infra]'") from exc


def _cmd_plan(args: argparse.Namespace) -> None:
    _require_pulumi("plan")
    from infra.kernel.config import load_stack_file
    from infra.plan import PolicyViolations, format_plan, plan

    cfg = load_stack_file(Path(args.project_dir), args.stack)
    result = plan(cfg)
    print(json.dumps(result.to_dict(cfg.environment), indent=2) if args.json else format_plan(result, cfg.environment))
    found = result.violations(cfg.environment)
    if found:
        raise PolicyViolations(f"stack {args.stack} breaks {len(found)} polic(ies): {', '.join(found)}")


def _cmd_render(args: argparse.Namespace) -> None:
    _require_pulumi("render")
    from infra.kernel.config import load_stack_file
    from infra.render import render, stale, write

    cfg = load_stack_file(Path(args.project_dir), args.stack)
    rendered = render(cfg)
    if args.check:
        differ = stale(rendered, Path(args.out))
        if differ:
            raise SpotrayError(f"render of stack {args.stack} in {args.out} is stale: {', '.join(differ[:8])}"
                               f"{' ...' if len(differ) > 8 else ''}; run `make render` and commit the result")
        print(f"render of stack {args.stack} in {args.out} is current")
        return
    write(rendered, Path(args.out))
    print(f"rendered {len(rendered.objects)} objects and {len(rendered.releases)} Helm releases of stack "
          f"{args.stack} into {args.out}; {len(rendered.secrets)} Secrets to provide: {args.out}/required-secrets.yaml")
    if cfg.gitops.controller:
        print(f"{cfg.gitops.controller}: once where the controller runs: kubectl apply -R -f {args.out}/gitops/")
    if cfg.gitops.controller == "flux" and rendered.releases:
        print(f"flux: the {len(rendered.releases)} Helm releases under {args.out}/helm/ are not applied by the "
              "Kustomization: install them with Flux's helm-controller, or with `pulumi up`")


def _cmd_pulumi_env(args: argparse.Namespace) -> None:
    from infra.kernel.config import load_stack_file

    gitops = load_stack_file(Path(args.project_dir), args.stack).gitops
    print(f"backend-url={gitops.state_backend}\nsecrets-provider={gitops.secrets_provider}\n"
          f"organization={gitops.organization}\nroles={str(gitops.roles).lower()}")


def _cmd_submit(args: argparse.Namespace) -> None:
    from cluster.submit import submit
    from infra.kernel.config import load_stack_file
    from spotray import config

    train = config.load(args.config, list(args.set or []))
    stack = load_stack_file(Path(args.project_dir), args.stack)
    print(submit(train, stack, image=args.image, gpu_pool=args.gpu_pool, context=args.context, dry_run=args.dry_run))


def register(sub: argparse._SubParsersAction) -> None:
    """The provisioning half: offline previews of a stack, and jobs onto its cluster."""
    p = sub.add_parser("plan", help="offline preview: every resource `pulumi up` would create for a stack")
    p.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--project-dir", default=".", help="directory of Pulumi.yaml (default: current)")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("render", help="offline: the stack's Kubernetes objects as YAML files for GitOps")
    p.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    p.add_argument("--out", required=True, help="directory to write (new, empty, or an earlier render)")
    p.add_argument("--check", action="store_true", help="write nothing; fail if --out differs from a fresh render")
    p.add_argument("--project-dir", default=".", help="directory of Pulumi.yaml (default: current)")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("pulumi-env", help="the stack's Pulumi state backend and whether it has pipeline roles, "
                       "as key=value lines for $GITHUB_OUTPUT")
    p.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    p.add_argument("--project-dir", default=".", help="directory of Pulumi.yaml (default: current)")
    p.set_defaults(func=_cmd_pulumi_env)

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


def main(argv: list[str] | None = None) -> int:
    return training_cli.main(argv, register)


if __name__ == "__main__":
    sys.exit(main())
