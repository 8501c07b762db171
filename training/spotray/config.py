"""The one training config tree: YAML + ``--set key=value`` overrides -> frozen, validated dataclasses.

Field names are the YAML keys, except ``checkpoint.async`` (a Python keyword) which is ``async_save``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotray.errors import ConfigError, closest, key_text, yaml_error_text
from spotray.storage import StorageOptions

AUTO = "auto"  # an interval spotray chooses (checkpoint.every_steps, fault_tolerance.preemption_check_every_steps)

MODEL_PRESETS = {  # (n_layer, n_head, n_embd) of the built-in GPT
    "tiny": (2, 2, 64),
    "small": (6, 6, 384),
    "gpt2-124m": (12, 12, 768),
    "gpt2-350m": (24, 16, 1024),
}
SPOT_NOTICE_S = 120  # EC2 gives a spot instance two minutes between its interruption notice and its end
_YAML_ALIASES = {"async": "async_save"}


def _require(ok: bool, key: str, problem: str, fix: str = "") -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


@dataclass(frozen=True)
class RunSection:
    name: str = "spotray"

    def __post_init__(self):
        ok = bool(self.name) and len(self.name) <= 63 and all(c.isalnum() or c in "-_." for c in self.name)
        _require(ok, "run.name", f"'{self.name}' is not a valid run name", "use 1-63 letters, digits, '-', '_' or '.'")


@dataclass(frozen=True)
class DataSection:
    path: str = ""  # required, except for a script (script.path), which reads its own data
    val_path: str | None = None  # a prepared dataset to evaluate on; unset: <path>/val where prepare wrote one

    def __post_init__(self):
        _require(self.val_path != "", "data.val_path", "is empty",
                 "give a prepared dataset's URL, or leave it out for <data.path>/val")


@dataclass(frozen=True)
class HFSection:
    """A Hugging Face Transformers causal LM: built from ``config`` (a config.json URL, a directory holding one,
    or an inline mapping) with fresh weights, or from the ``pretrained`` directory's config and weights."""

    config: str | dict | None = None
    pretrained: str | None = None

    def __post_init__(self):
        _require(self.config is not None or self.pretrained is not None, "model.hf",
                 "needs config or pretrained", "set model.hf.config=URL (or a mapping) or model.hf.pretrained=URL")
        _require(self.config is None or self.pretrained is None, "model.hf.config",
                 "is set together with model.hf.pretrained, whose directory has its own config.json",
                 "keep one of the two")
        _require(self.config != "" and self.pretrained != "", "model.hf", "has an empty URL",
                 "give a local path or s3://bucket/prefix")


@dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    dropout: float = 0.0
    task: str | None = None  # "package.module:factory", a user's task (see docs/own-model.md)
    hf: HFSection | None = None

    def __post_init__(self):
        _require(self.preset in MODEL_PRESETS, "model.preset", f"unknown preset '{self.preset}'",
                 f"choose one of {', '.join(MODEL_PRESETS)}")
        for key in ("n_layer", "n_head", "n_embd"):
            value = getattr(self, key)
            _require(value is None or value > 0, f"model.{key}", f"must be positive, got {value}")
        _require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        _require(self.task is None or self.hf is None, "model.task", "is set together with model.hf",
                 "a run trains one model: keep one of the two")
        module, sep, factory = (self.task or "m:f").partition(":")
        _require(bool(sep and module and factory.isidentifier()), "model.task",
                 f"'{self.task}' is not of the form package.module:factory",
                 "e.g. model.task=my_tasks.bigram:make_task")
        gpt_only = [k for k in ("n_layer", "n_head", "n_embd") if getattr(self, k) is not None]
        _require(not (gpt_only and (self.task or self.hf)), f"model.{gpt_only[0] if gpt_only else ''}",
                 "shapes the built-in GPT only", "remove it, or describe the size in your task or HF config")

    @property
    def kind(self) -> str:
        """Which task trains: "gpt" (built in), "hf" (Transformers) or "user" (model.task)."""
        return "user" if self.task else "hf" if self.hf else "gpt"


@dataclass(frozen=True)
class TrainSection:
    max_steps: int = 100
    global_batch_size: int = 8
    micro_batch_size: int | None = None
    seq_len: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 10
    stop_at_step: int | None = None  # end this attempt early, as a preemption would (drills); schedule unchanged
    dtype: str = "float32"
    compile: bool = False
    peak_tflops: float | None = None  # per device, for MFU; None: known GPUs are looked up, CPUs report none

    def __post_init__(self):
        _require(self.max_steps > 0, "train.max_steps", f"must be positive, got {self.max_steps}")
        _require(self.global_batch_size > 0, "train.global_batch_size",
                 f"must be positive, got {self.global_batch_size}")
        _require(self.micro_batch_size is None or self.micro_batch_size > 0, "train.micro_batch_size",
                 f"must be positive or unset, got {self.micro_batch_size}")
        _require(self.seq_len > 0, "train.seq_len", f"must be positive, got {self.seq_len}")
        _require(self.lr > 0, "train.lr", f"must be positive, got {self.lr}")
        _require(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        _require(self.warmup_steps >= 0, "train.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _require(self.grad_clip >= 0, "train.grad_clip", f"must be >= 0 (0 disables), got {self.grad_clip}")
        _require(self.log_every > 0, "train.log_every", f"must be positive, got {self.log_every}")
        _require(self.stop_at_step is None or 0 < self.stop_at_step <= self.max_steps, "train.stop_at_step",
                 f"must be in 1..train.max_steps, got {self.stop_at_step}")
        _require(self.dtype in ("float32", "bfloat16"), "train.dtype", f"unknown dtype '{self.dtype}'",
                 "use float32 or bfloat16 (bf16 autocast)")
        _require(self.peak_tflops is None or self.peak_tflops > 0, "train.peak_tflops",
                 f"must be positive or unset, got {self.peak_tflops}", "give the device's dense bf16 peak, e.g. 989")


@dataclass(frozen=True)
class ScalingSection:
    """``min_workers``: the fewest workers a run goes on with when nodes are lost; unset: ``num_workers``, and a lost
    node is waited for. A smaller run grows back at a committed step once more workers have fit, at every look, for
    ``grow_after_s`` (over gloo: a replacement worker waits at the keeper, or the cluster holds more workers than a
    fit the driver started small has; over NCCL: the whole group fits)."""

    num_workers: int = 2
    use_gpu: bool = False
    resources_per_worker: dict = field(default_factory=dict)
    min_workers: int | None = None
    grow_after_s: float = 30.0
    workers_per_node: int = 1  # a node runs this many (a RayJob's pod, one per GPU): the run shrinks by whole nodes

    def __post_init__(self):
        _require(self.num_workers > 0, "scaling.num_workers", f"must be positive, got {self.num_workers}")
        _require(self.min_workers is None or isinstance(self.min_workers, int) and not isinstance(
            self.min_workers, bool) and 1 <= self.min_workers <= self.num_workers, "scaling.min_workers",
            f"must be a count from 1 to scaling.num_workers={self.num_workers}, got {self.min_workers!r}",
            "leave it unset to wait for a lost node instead of going on with fewer workers")
        _require(self.workers_per_node >= 1, "scaling.workers_per_node", f"must be at least 1, got "
                 f"{self.workers_per_node}", "give the workers one node runs (its GPUs), or leave it at 1")
        for key, count in (("scaling.num_workers", self.num_workers), ("scaling.min_workers", self.min_workers)):
            _require(count is None or count % self.workers_per_node == 0, key, f"{count} is not a number of whole "
                     f"nodes of scaling.workers_per_node={self.workers_per_node}",
                     f"use a multiple of {self.workers_per_node}")
        _require(self.grow_after_s >= 0, "scaling.grow_after_s", f"must be >= 0, got {self.grow_after_s}",
                 "seconds more workers must have fit before a smaller run grows, e.g. 30")
        for key, value in self.resources_per_worker.items():
            _require(isinstance(value, (int, float)) and value >= 0, f"scaling.resources_per_worker.{key}",
                     f"must be a non-negative number, got {value!r}")

    @property
    def worker_resources(self) -> dict:
        """What Ray Train reserves for one worker: the non-zero ``resources_per_worker``, else a CPU, or a GPU
        alone where ``use_gpu`` (which also adds a GPU to ``resources_per_worker`` that names none)."""
        if not self.resources_per_worker:
            return {"GPU": 1} if self.use_gpu else {"CPU": 1}
        resources = {name: amount for name, amount in self.resources_per_worker.items() if amount}
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        return resources

    @property
    def fewest_workers(self) -> int:
        return self.num_workers if self.min_workers is None else self.min_workers

    @property
    def backend(self) -> str:
        """The process group's backend."""
        return "nccl" if self.use_gpu else "gloo"


@dataclass(frozen=True)
class CheckpointSection:
    path: str = "./spotray-runs"
    every_steps: int | str = 50  # or "auto": the Young–Daly interval (spotray.worker.cadence)
    keep_last: int = 3
    keep_best: bool = False  # also keep the committed checkpoint with the lowest val loss (evaluated at each save)
    async_save: bool = False
    save_failure_budget_s: float = 900.0  # how long saves may keep failing (storage outage) before the run stops

    def __post_init__(self):
        _require(bool(self.path), "checkpoint.path", "is required", "give a local directory or s3://bucket/prefix")
        _require(self.every_steps == AUTO or isinstance(self.every_steps, int) and self.every_steps > 0,
                 "checkpoint.every_steps", f"must be a positive number of steps or auto, got {self.every_steps!r}",
                 "auto picks it from the measured save time and fault_tolerance.expected_interruptions_per_hour")
        _require(self.keep_last >= 1, "checkpoint.keep_last", f"must be >= 1, got {self.keep_last}")
        _require(self.save_failure_budget_s >= 0, "checkpoint.save_failure_budget_s",
                 f"must be >= 0 seconds, got {self.save_failure_budget_s}", "0 stops the run at the first failed save")


@dataclass(frozen=True)
class SnapshotSection:
    """In-memory snapshots of the training state on the run's nodes, between checkpoints and with them
    (spotray.snapshots): a kill then costs the steps since the last snapshot, read back from a surviving node instead
    of storage."""

    every_steps: int | str = AUTO  # auto: Young–Daly at the expected rate, never over 2 % of step time; a count; 0: off
    max_gb_per_node: float | None = None  # None: half of what the node (its pod, under its limit) has room for

    def __post_init__(self):
        every = self.every_steps
        _require(every == AUTO or isinstance(every, int) and not isinstance(every, bool) and every >= 0,
                 "snapshot.every_steps", f"must be a number of steps, auto or 0 (off), got {every!r}",
                 "auto keeps their cost under 2 % of the step time")
        _require(self.max_gb_per_node is None or self.max_gb_per_node > 0, "snapshot.max_gb_per_node",
                 f"must be positive, got {self.max_gb_per_node}", "leave it unset for half of the node's free memory")

    @property
    def enabled(self) -> bool:
        return self.every_steps != 0

    @property
    def max_bytes(self) -> int | None:
        return None if self.max_gb_per_node is None else int(self.max_gb_per_node * 1e9)


@dataclass(frozen=True)
class EvalSection:
    """Validation loss during training: every ``every_steps`` (unset: off, unless checkpoint.keep_best), and at the
    end, on the same ``samples`` of the validation set each time."""

    every_steps: int | None = None
    samples: int = 256

    def __post_init__(self):
        _require(self.every_steps is None or self.every_steps > 0, "eval.every_steps",
                 f"must be a positive number of steps or unset (off), got {self.every_steps}")
        _require(self.samples > 0, "eval.samples", f"must be positive, got {self.samples}")


@dataclass(frozen=True)
class MlflowSection:
    uri: str = ""  # the tracking server, e.g. http://mlflow.example:5000 (or a sqlite:/// URI)
    experiment: str = "spotray"

    def __post_init__(self):
        _require(bool(self.uri), "tracking.mlflow.uri", "is required",
                 "give the tracking server's URL, e.g. http://127.0.0.1:5000")
        _require(bool(self.experiment), "tracking.mlflow.experiment", "is empty", "name the MLflow experiment")


WANDB_MODES = ("online", "offline")


@dataclass(frozen=True)
class WandbSection:
    project: str = ""
    entity: str | None = None
    mode: str = "online"  # offline: records stay in the run's wandb directory, `wandb sync` uploads them later

    def __post_init__(self):
        _require(bool(self.project), "tracking.wandb.project", "is required", "name the W&B project")
        _require(self.mode in WANDB_MODES, "tracking.wandb.mode", f"unknown mode '{self.mode}'",
                 f"use one of {', '.join(WANDB_MODES)}")


@dataclass(frozen=True)
class TensorboardSection:
    dir: str = ""  # a local directory; for a run on s3:// it is also uploaded to <run>/tensorboard

    def __post_init__(self):
        _require(bool(self.dir) and "://" not in self.dir, "tracking.tensorboard.dir",
                 f"must be a local directory, got {self.dir!r}",
                 "give a local path; a run on s3:// uploads the event files beside its checkpoints")


@dataclass(frozen=True)
class TrackingSection:
    """Experiment trackers the driver logs the run to; any combination, all off by default."""

    mlflow: MlflowSection | None = None
    wandb: WandbSection | None = None
    tensorboard: TensorboardSection | None = None

    @property
    def enabled(self) -> bool:
        return any((self.mlflow, self.wandb, self.tensorboard))


@dataclass(frozen=True)
class ScriptSection:
    """A user's own training script run on every worker (``spotray train --script``) instead of spotray's loop."""

    path: str | None = None  # the script, relative to runtime.working_dir where that is set
    args: list = field(default_factory=list)  # its command-line arguments (after ``--``)
    # Node-local scratch for restored checkpoints and the Trainer's output_dir; unset: $SPOTRAY_LOCAL_DIR (the
    # RayJob's volume), else the system's temporary directory.
    local_dir: str | None = None
    # Resume a checkpoint saved by another number of workers: the Trainer's per-rank RNG files then do not match.
    allow_world_size_change: bool = False
    debug: bool = False  # Ray's post-mortem debugger on the workers (spotray train --debug)

    def __post_init__(self):
        _require(self.path != "", "script.path", "is empty", "give the script's file, e.g. finetune.py")
        _require(all(isinstance(a, str) for a in self.args), "script.args",
                 f"must be a list of strings, got {self.args!r}", "quote numbers, e.g. ['--epochs', '3']")
        _require(self.local_dir != "", "script.local_dir", "is empty",
                 "give a node-local directory, or leave it out for $SPOTRAY_LOCAL_DIR")


@dataclass(frozen=True)
class StorageSection:
    endpoint_url: str | None = None
    region: str | None = None

    def options(self) -> StorageOptions:
        return StorageOptions(endpoint_url=self.endpoint_url, region=self.region,
                              endpoint_setting="storage.endpoint_url")


DEFAULT_INTERRUPTIONS_PER_HOUR = 1.0
CAPACITY_TYPES = ("spot", "on-demand")  # Karpenter's karpenter.sh/capacity-type values
# EC2's <family>.<size>, e.g. g5.xlarge, p5.48xlarge, g6e.12xlarge, trn1n.32xlarge
INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+")


def check_prices(prices: Any, key: str) -> None:
    """``{instance_type: {capacity_type: USD per hour}}``: a known shape, positive numbers."""
    _require(isinstance(prices, dict), key, f"must map instance types to prices, got {prices!r}",
             "e.g. {g5.xlarge: {spot: 0.45, on-demand: 1.006}}")
    for instance_type, by_capacity in prices.items():
        where = f"{key}.{instance_type}"
        _require(isinstance(instance_type, str) and bool(INSTANCE_TYPE.fullmatch(instance_type)), where,
                 "is not an EC2 instance type", "use a name like g5.xlarge or p5.48xlarge")
        _require(isinstance(by_capacity, dict) and bool(by_capacity), where, f"must map capacity types to USD per "
                 f"hour, got {by_capacity!r}", "e.g. {spot: 0.45, on-demand: 1.006}")
        for capacity, price in by_capacity.items():
            _require(capacity in CAPACITY_TYPES, f"{where}.{capacity}", "is not a capacity type",
                     f"use {' or '.join(CAPACITY_TYPES)}")
            _require(isinstance(price, (int, float)) and not isinstance(price, bool) and price > 0,
                     f"{where}.{capacity}", f"is {price!r}", "give a positive price in USD per hour")


@dataclass(frozen=True)
class NodeSection:
    """What a node is, where Kubernetes cannot say (off Kubernetes, or the head): unset fields are unknown."""

    instance_type: str | None = None
    capacity_type: str | None = None
    zone: str | None = None

    def __post_init__(self):
        _require(self.instance_type is None or bool(INSTANCE_TYPE.fullmatch(self.instance_type)),
                 "cost.node.instance_type", f"{self.instance_type!r} is not an EC2 instance type",
                 "use a name like g5.xlarge, or leave it out")
        _require(self.capacity_type in (None, *CAPACITY_TYPES), "cost.node.capacity_type",
                 f"is {self.capacity_type!r}", f"use {' or '.join(CAPACITY_TYPES)}")


@dataclass(frozen=True)
class CostSection:
    """What the run's nodes cost. Prices, by precedence: ``prices`` (USD per hour per instance type and capacity
    type; a RayJob of a stack gets its GPU pool's), Karpenter's estimates from ``prometheus_url``, then
    ``prices_file`` (written by ``spotray prices``). Unpriced nodes show as unknown, never as free."""

    prices: dict = field(default_factory=dict)
    prices_file: str | None = None
    prometheus_url: str | None = None  # a Prometheus scraping Karpenter's metrics
    node: NodeSection = field(default_factory=NodeSection)  # the workers' nodes off Kubernetes
    head: NodeSection | None = None  # the head node, billed on a separate line (with the core nodes) where set
    core: NodeSection | None = None  # the cluster's core nodes (system pods, monitoring), on that line too
    core_nodes: int = 0  # how many of them the run's cluster holds
    warm_spares: int = 0  # idle spare nodes of the workers' instance type held for the run (the pool's warmSpares)
    example_prices: bool = False  # the prices are examples (make demo): every figure says so

    def __post_init__(self):
        check_prices(self.prices, "cost.prices")
        _require(self.prices_file != "", "cost.prices_file", "is empty", "give the URL `spotray prices` wrote")
        _require(self.prometheus_url is None or self.prometheus_url.startswith(("http://", "https://")),
                 "cost.prometheus_url", f"{self.prometheus_url!r} is not an http(s) URL",
                 "e.g. http://prometheus-operated.monitoring:9090")
        _require(self.warm_spares >= 0, "cost.warm_spares", f"is {self.warm_spares}", "use 0 or a count of nodes")
        _require(self.core_nodes >= 0 and (self.core_nodes == 0 or self.core is not None), "cost.core_nodes",
                 f"is {self.core_nodes}", "give 0, or the core nodes' count with cost.core naming their instance type")


@dataclass(frozen=True)
class FaultToleranceSection:
    """Real failures and preemptions have separate budgets: on spot, preemptions are routine."""

    max_failures: int = 3
    max_preemptions: int = -1
    preemption_check_every_steps: int | str = AUTO  # or a count; auto: about once a second (spotray.worker.cadence)
    # What checkpoint.every_steps: auto plans for. None: the GPU pool's interruptionsPerHour where the stack sets it
    # (cluster/rayjob.py fills it in), else DEFAULT_INTERRUPTIONS_PER_HOUR.
    expected_interruptions_per_hour: float | None = None
    move_on_notice: bool = True  # after a notice's checkpoint, restart on other capacity instead of waiting

    def __post_init__(self):
        for key in ("max_failures", "max_preemptions"):
            value = getattr(self, key)
            _require(value >= -1, f"fault_tolerance.{key}", f"must be -1 (infinite), 0 (off) or a count, got {value}")
        every = self.preemption_check_every_steps
        _require(every == AUTO or isinstance(every, int) and every > 0, "fault_tolerance.preemption_check_every_steps",
                 f"must be a positive number of steps or auto, got {every!r}", "auto asks about once a second")
        rate = self.expected_interruptions_per_hour
        _require(rate is None or rate > 0, "fault_tolerance.expected_interruptions_per_hour",
                 f"must be positive, got {rate}", "give the pool's interruptions per hour, e.g. 0.5 (one every two "
                 "hours), or leave it out for the pool's own or 1")

    @property
    def interruptions_per_hour(self) -> float:
        return self.expected_interruptions_per_hour or DEFAULT_INTERRUPTIONS_PER_HOUR


@dataclass(frozen=True)
class EnvSection:
    forward: list = field(default_factory=list)  # names of driver variables copied to every worker
    # True where every Ray node already has the storage credentials and the env.forward variables (the RayJob's
    # pods get them from Secrets): nothing is then copied, because a runtime_env with env_vars makes Ray start
    # fresh worker processes on every restart instead of reusing its idle ones.
    on_nodes: bool = False

    def __post_init__(self):
        _require(isinstance(self.on_nodes, bool), "env.on_nodes", f"must be true or false, got {self.on_nodes!r}")
        for name in self.forward:
            _require(isinstance(name, str) and name.replace("_", "").isalnum(), "env.forward",
                     f"{name!r} is not an environment variable name", "list names like WANDB_API_KEY, not values")


@dataclass(frozen=True)
class RuntimeSection:
    working_dir: str | None = None  # a local dir shipped to every worker, or the URI of a zip of one
    max_package_mb: int = 256

    def __post_init__(self):
        _require(self.max_package_mb > 0, "runtime.max_package_mb", f"must be positive, got {self.max_package_mb}")
        if self.working_dir is not None and self.working_dir_is_uri:
            _require(self.working_dir.split("?", 1)[0].endswith(".zip"), "runtime.working_dir",
                     f"{self.working_dir} is a URI but not of a .zip", "give a local directory, or the URI of a zip "
                     "of it (s3://bucket/code.zip)")

    @property
    def working_dir_is_uri(self) -> bool:
        """A package the workers fetch (``s3://bucket/code.zip``), not a local directory."""
        return self.working_dir is not None and "://" in self.working_dir


@dataclass(frozen=True)
class TrainConfig:
    run: RunSection = field(default_factory=RunSection)
    seed: int = 0
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    parallel: str = "ddp"
    scaling: ScalingSection = field(default_factory=ScalingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    snapshot: SnapshotSection = field(default_factory=SnapshotSection)
    storage: StorageSection = field(default_factory=StorageSection)
    fault_tolerance: FaultToleranceSection = field(default_factory=FaultToleranceSection)
    env: EnvSection = field(default_factory=EnvSection)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    script: ScriptSection = field(default_factory=ScriptSection)
    cost: CostSection = field(default_factory=CostSection)
    audit_dir: str | None = None

    def __post_init__(self):
        _require(self.parallel in ("ddp", "fsdp"), "parallel", f"unknown value '{self.parallel}'", "use ddp or fsdp")
        if self.script.path:
            _require(self.scaling.fewest_workers == self.scaling.num_workers, "scaling.min_workers",
                     "shrinks spotray's own loop only: a script's run cannot go on with fewer workers yet",
                     "leave it unset with script.path; the run then waits for a lost node's replacement")
            return  # the script owns its data and batches
        _require(bool(self.data.path), "data.path", "is required",
                 "run `spotray prepare --output URL` and set data.path=URL")
        workers, batch = self.scaling.num_workers, self.train.global_batch_size
        _require(workers <= batch, "scaling.num_workers",
                 f"{workers} workers exceed train.global_batch_size={batch}",
                 "lower scaling.num_workers or raise train.global_batch_size")
        _require(batch % workers == 0, "train.global_batch_size",
                 f"{batch} is not divisible by scaling.num_workers={workers}",
                 "pick a global batch that every world size you resume with divides (e.g. 12 for 1, 2, 3, 4 workers)")
        sizes = range(self.scaling.fewest_workers, workers + 1, self.scaling.workers_per_node)
        odd = [size for size in sizes if batch % size]
        _require(not odd, "train.global_batch_size",
                 f"{batch} is not divisible by {odd[0] if odd else 0} workers, a size scaling.min_workers="
                 f"{self.scaling.min_workers} lets the run shrink to",
                 f"pick a global batch that every size from {sizes.start} to {workers} divides (e.g. "
                 f"{math.lcm(*sizes)}), or raise scaling.min_workers")

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates on held-out data: eval.every_steps is set, or checkpoint.keep_best needs it."""
        return self.eval.every_steps is not None or self.checkpoint.keep_best

    def per_worker_batch(self, workers: int) -> int:
        """Each worker's share of the global batch on ``workers`` workers (a run that shrank has fewer)."""
        return self.train.global_batch_size // workers

    def to_dict(self) -> dict:
        return _to_plain(self)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        reverse = {v: k for k, v in _YAML_ALIASES.items()}
        return {reverse.get(f.name, f.name): _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def from_dict(raw: dict) -> TrainConfig:
    """Build a TrainConfig; unknown keys and wrong types are errors naming the key."""
    return _build(TrainConfig, raw, prefix="")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(prefix.rstrip(".") or "<root>", f"expected a section of keys, got {reprlib.repr(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        name = _YAML_ALIASES.get(key, key)
        if name not in fields:
            named = sorted(_reverse_alias(n) for n in fields)
            raise ConfigError(f"{prefix}{key_text(key)}", "unknown key",
                              f"{closest(key, named)}valid keys here: {', '.join(named)}")
        kwargs[name] = _coerce(hints[name], value, f"{prefix}{key}")
    return cls(**kwargs)


def _reverse_alias(name: str) -> str:
    return {v: k for k, v in _YAML_ALIASES.items()}.get(name, name)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value if value is not None else {}, f"{key}.")
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _coerce_union(typing.get_args(hint), value, key)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    expected = typing.get_origin(hint) or hint
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(key, f"expected {_kind(hint)}, got {reprlib.repr(value)}")
    return value


def _coerce_union(options: tuple, value: Any, key: str) -> Any:
    if value is None and type(None) in options:
        return None
    for candidate in (a for a in options if a is not type(None)):
        try:
            return _coerce(candidate, value, key)
        except ConfigError as exc:
            if exc.field != key:  # the value is of this kind, and something inside it is wrong: say that
                raise
    kinds = " or ".join(_kind(a) for a in options if a is not type(None))
    raise ConfigError(key, f"expected {kinds}, got {reprlib.repr(value)}",
                      "give one, or leave the key out for its default" if type(None) in options else "")


def _kind(hint: Any) -> str:
    """A type as the YAML a user writes: ``int`` -> a whole number."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return "a section of keys"
    origin = typing.get_origin(hint) or hint
    return _KINDS.get(origin, getattr(origin, "__name__", str(origin)))


_KINDS = {int: "a whole number", float: "a number", str: "text", bool: "true or false", list: "a list",
          tuple: "a list", dict: "a mapping of keys to values"}


def parse_overrides(pairs: list[str]) -> dict:
    """``["train.lr=3e-4", "scaling.use_gpu=true"]`` -> nested dict; values are parsed as YAML scalars."""
    out: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ConfigError(pair, "an override must look like key=value", "e.g. --set train.lr=3e-4")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(key, "conflicts with another --set of its parent key")
        node[parts[-1]] = _parse_scalar(text)
    return out


def _parse_scalar(text: str) -> Any:
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return text if value is None and text not in ("null", "~", "") else value


def merge(base: dict, overlay: dict) -> dict:
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load(path: str | None, overrides: list[str] | None = None, base: dict | None = None) -> TrainConfig:
    """Read a YAML file (optional), apply an optional base and ``--set`` overrides, validate once."""
    raw: dict = dict(base or {})
    if path:
        file = Path(path)
        if not file.is_file():
            raise ConfigError("--config", f"file not found: {path}")
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"{path} is not valid YAML {yaml_error_text(exc)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError("--config", f"{path} must contain a mapping of config keys")
        raw = merge(raw, loaded)
    return from_dict(merge(raw, parse_overrides(overrides or [])))
