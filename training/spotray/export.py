"""``spotray export``: a committed checkpoint -> a Hugging Face model directory (config.json, safetensors, tokenizer).

Reads only the model's tensors (not the optimizer state), one output file's worth at a time, and writes them one
by one, so that memory stays near the size of one output file; writes only under ``--out``, never in the run."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import torch

from spotray.checkpoints import safetensors_file
from spotray.checkpoints.dcp import (
    FILES_FORMAT,
    CommittedCheckpoint,
    best_checkpoint,
    checkpoints_root,
    list_committed,
    list_set_aside,
    load_model_tensors,
    model_tensors,
    read_model_record,
)
from spotray.data.hf_byte_tokenizer import byte_tokenizer_files
from spotray.data.tokenizer import BYTES, ByteTokenizer
from spotray.errors import CheckpointError, SpotrayError
from spotray.storage import Location, StorageOptions, resolve
from spotray.tasks import EXPORT_DTYPES, GENERATION_CONFIG
from spotray.tasks.gpt import to_gpt2

RENAMES = {"gpt": to_gpt2}
BUILT_IN_TASKS = ("gpt", "hf")  # trained on a prepared dataset: a tokenizer.json copied from it, or bytes
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3


class ExportError(SpotrayError):
    pass


def export(run_url: str, out: str, step: int | None = None, options: StorageOptions | None = None,
           max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, best: bool = False, dtype: str | None = None) -> dict:
    """Write step ``step`` (default: the newest committed; ``best``: the lowest validation loss) of the run at
    ``run_url`` to ``out``, its floating-point weights in ``dtype`` (default: the dtype its config.json names, the
    one a pretrained model came in; else float32); returns a summary."""
    run_root = resolve(run_url, options)
    checkpoint = _pick_best(run_root) if best else _pick(run_root, step)
    if checkpoint.is_files:
        raise ExportError(f"checkpoint step {checkpoint.step} holds a training script's own files ({FILES_FORMAT}), "
                          "not spotray's: its script saves the model (e.g. trainer.save_model), or copy "
                          f"{checkpoint.location.child('files').url} as it is")
    record, tokenizer_files = read_model_record(run_root)
    if record is None:
        raise ExportError(f"{run_url} records no model description (checkpoints/model.json): it was trained by an "
                          "older spotray; re-run one step of it with this version, then export")
    out_dir = resolve(out, options)
    if out_dir.child("config.json").exists() or out_dir.child(WEIGHTS).exists() or out_dir.child(INDEX).exists():
        raise ExportError(f"--out {out} already holds a model: choose an empty directory")
    out_dir.check_writable()  # before a shard's worth of the checkpoint is read for nothing
    hf_config = record.get("hf_config")
    dtype = dtype or (hf_config or {}).get("dtype") or "float32"
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"--dtype {dtype}: use one of {', '.join(EXPORT_DTYPES)}")
    stored = functools.partial(_stored, getattr(torch, dtype))
    names = _shards(model_tensors(checkpoint), max_shard_bytes, stored)
    rename = RENAMES[record["rename"]] if record.get("rename") else dict
    files = _write_weights(checkpoint, names, rename, out_dir, stored)
    if hf_config:
        hf_config = {**hf_config, "dtype": dtype}
    if not tokenizer_files and hf_config and _trained_on_bytes(record):
        tokenizer_files = byte_tokenizer_files()
        eot = ByteTokenizer.eot_token
        hf_config = {**hf_config, "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    configs = {"config.json": hf_config, GENERATION_CONFIG: record.get("hf_generation_config")}
    configs = {name: config for name, config in configs.items() if config}
    for name, config in configs.items():
        out_dir.child(name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name, data in tokenizer_files.items():
        out_dir.child(name).write_bytes(data)
    return {"step": checkpoint.step, "out": out, "dtype": dtype, "files": files, "config": list(configs),
            "tokenizer": list(tokenizer_files)}


def _stored(dtype: torch.dtype, tensor_dtype: torch.dtype) -> torch.dtype:
    """What a tensor is written as: floating-point ones in the export's dtype, others (integer buffers) as they are."""
    return dtype if tensor_dtype.is_floating_point else tensor_dtype


def _trained_on_bytes(record: dict) -> bool:
    """The model record names the dataset's tokenizer; an older one does not, and then a built-in task with no
    tokenizer.json copied from its dataset was trained on bytes."""
    if "tokenizer" in record:
        return record["tokenizer"] == BYTES
    return record.get("task") in BUILT_IN_TASKS


def _pick(run_root: Location, step: int | None) -> CommittedCheckpoint:
    committed = list_committed(checkpoints_root(run_root), warn=False)
    if not committed:
        raise ExportError(f"no committed checkpoint under {run_root.url}: give the run's URL "
                          "(<checkpoint.path>/<run.name>) of a run that saved one")
    if step is None:
        return committed[0]
    match = [c for c in committed if c.step == step]
    set_aside = [r for r in list_set_aside(run_root) if r["step"] == step]
    if not match and set_aside:
        record = set_aside[-1]
        raise ExportError(f"--step {step} was set aside from the run's lineage, to {record['url']}, because it cannot "
                          f"be read ({record['reason']}); the run went on from step {record['resumed_from']}: "
                          f"export the newest, step {committed[0].step}, by leaving --step out")
    if not match:
        steps = ", ".join(str(c.step) for c in reversed(committed))
        raise ExportError(f"--step {step} is not a committed checkpoint of {run_root.url}: committed steps are {steps}")
    return match[0]


def _pick_best(run_root: Location) -> CommittedCheckpoint:
    committed = list_committed(checkpoints_root(run_root), warn=False)
    best = best_checkpoint(committed)
    if best is None:
        raise ExportError(f"--best: no committed checkpoint of {run_root.url} has a validation loss: train with "
                          "checkpoint.keep_best=true (it evaluates at every checkpoint), or export --step N")
    return best


def _shards(tensors: dict[str, tuple[torch.dtype, tuple]], max_bytes: int, stored) -> list[list[str]]:
    """Tensor names in groups of at most ``max_bytes`` as written (a larger tensor gets a group of its own)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, (dtype, shape) in tensors.items():
        nbytes = torch.Size(shape).numel() * stored(dtype).itemsize
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _write_weights(checkpoint: CommittedCheckpoint, groups: list[list[str]], rename, out_dir: Location,
                   stored) -> list[str]:
    single = len(groups) == 1
    weight_map, files = {}, []
    with tempfile.TemporaryDirectory() as scratch:
        for i, names in enumerate(groups):
            try:
                tensors = rename(load_model_tensors(checkpoint, names))
            except CheckpointError as exc:
                raise ExportError(str(exc)) from None
            tensors = {key: tensor.to(stored(tensor.dtype)) for key, tensor in tensors.items()}
            name = WEIGHTS if single else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            local = Path(scratch, name)
            safetensors_file.write(tensors, str(local))
            out_dir.child(name).put_file(str(local))
            local.unlink()
            weight_map.update(dict.fromkeys(tensors, name))
            files.append(name)
            del tensors
    if not single:
        index = {"metadata": {"total_size": _total_bytes(checkpoint, groups, stored)}, "weight_map": weight_map}
        out_dir.child(INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        files.append(INDEX)
    return files


def _total_bytes(checkpoint: CommittedCheckpoint, groups: list[list[str]], stored) -> int:
    shapes = model_tensors(checkpoint)
    return sum(torch.Size(shapes[n][1]).numel() * stored(shapes[n][0]).itemsize for group in groups for n in group)
