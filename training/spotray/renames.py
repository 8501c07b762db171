"""What changed names, for what earlier versions wrote (the classes a checkpoint's ``.metadata`` pickles, a task path
in a config): releases up to 0.1.0 installed this package as ``training``, not ``spotray``; and until they were grouped
into packages, its modules lay side by side (``spotray.checkpoints.dcp``, now ``spotray.checkpoints.dcp``)."""

from __future__ import annotations

_OLD_PACKAGE = "training"
# a module of the side-by-side layout (below spotray) -> where it lives now
MOVED: dict[str, str] = {
    "ledger": "accounts.ledger", "goodput": "accounts.goodput", "nodes": "accounts.node_records",
    "cost": "accounts.cost", "prices": "accounts.prices", "aws_prices": "accounts.aws_prices",
    "checkpoint": "checkpoints.dcp", "files_checkpoint": "checkpoints.script_files",
    "save_budget": "checkpoints.save_retries", "weights_file": "checkpoints.safetensors_file",
    "model": "tasks.gpt_model", "tasks.hf": "tasks.hf_causal_lm", "data.progress": "data.prepare_progress",
    "sampler": "step.sampler", "batches": "step.batches", "optim": "step.optim", "parallel": "step.parallel",
    "evaluation": "step.evaluation", "loop": "worker.loop", "session": "worker.session",
    "script": "worker.user_script", "cadence": "worker.cadence", "interval": "worker.cadence",
    "telemetry": "worker.telemetry", "memory": "worker.memory",
    "status": "reports.status", "cost_report": "reports.cost_report", "summary": "reports.summary",
    "planner": "planning.planner", "planner_ledger": "planning.calibration", "estimate": "planning.estimate",
    "launch": "driver.launch", "console": "driver.console", "runtime_env": "driver.runtime_env",
    "capacity": "driver.placement", "progress": "driver.progress", "head_watch": "driver.head_watch",
}


def renamed(module: str) -> str | None:
    """The current name of a module of an older release (``training.checkpoint`` and ``spotray.checkpoints.dcp`` ->
    ``spotray.checkpoints.dcp``), or None for any other module."""
    package, _, below = module.partition(".")
    if package == _OLD_PACKAGE:
        return f"spotray.{_moved(below)}" if below else "spotray"
    if package == "spotray" and below and _moved(below) != below:
        return f"spotray.{_moved(below)}"
    return None


def _moved(below: str) -> str:
    parts = below.split(".")
    for count in range(len(parts), 0, -1):
        head = ".".join(parts[:count])
        if head in MOVED:
            return ".".join([MOVED[head], *parts[count:]])
    return below
