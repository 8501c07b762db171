"""Pretrained weights from a Hugging Face model directory (``model.safetensors`` or a sharded index), local or S3.

Each rank reads only the bytes of the parameter rows it holds: a safetensors file starts with a JSON header giving
every tensor's dtype, shape and byte range, and an FSDP2 shard is a contiguous block of rows (``Shard(0)``)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Shard

from training.errors import ConfigError, StorageError
from training.storage import Location

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


@dataclass(frozen=True)
class _Entry:
    file: Location
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file


def load_sharded(model: torch.nn.Module, directory: Location, setting: str) -> int:
    """Copy every parameter and persistent buffer's local part from ``directory``; returns the bytes read."""
    entries = _catalogue(directory, setting)
    tied = _tied_names(model)
    read = 0
    for name, tensor in _loadable(model):
        entry = entries.get(name) or entries.get(_without_prefix(model, name))
        if entry is None:
            if name in tied:
                continue
            raise ConfigError(setting, f"{directory.url} has no tensor '{name}'",
                              "point it at a directory saved from this model class (save_pretrained)")
        read += _copy_local_part(tensor, entry, name, setting)
    return read


def _loadable(model: torch.nn.Module):
    persistent = set(model.state_dict().keys())
    yield from model.named_parameters()
    yield from ((n, b) for n, b in model.named_buffers() if n in persistent)


def _tied_names(model: torch.nn.Module) -> set[str]:
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    return set(getattr(model, "_tied_weights_keys", None) or ())


def _without_prefix(model: torch.nn.Module, name: str) -> str:
    """Checkpoints of a base model (e.g. the original GPT-2's) name tensors without the ``transformer.`` prefix."""
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    return name[len(prefix):] if name.startswith(prefix) else name


def _catalogue(directory: Location, setting: str) -> dict[str, _Entry]:
    index, single = directory.child(INDEX), directory.child(WEIGHTS)
    if index.exists():
        weight_map = _json(index, setting).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConfigError(setting, f"{index.url} has no weight_map", "re-save the model with save_pretrained")
        files = sorted(set(weight_map.values()))
    elif single.exists():
        files = [WEIGHTS]
    else:
        raise ConfigError(setting, f"no {WEIGHTS} or {INDEX} in {directory.url}",
                          "give a directory written by save_pretrained(safe_serialization=True)")
    entries: dict[str, _Entry] = {}
    for name in files:
        entries.update(_header(directory.child(name), setting))
    return entries


def _header(file: Location, setting: str) -> dict[str, _Entry]:
    try:
        (length,) = struct.unpack("<Q", file.read_range(0, 8))
        header = json.loads(file.read_range(8, length))
    except (StorageError, struct.error, ValueError) as exc:
        raise ConfigError(setting, f"{file.url} is not a readable safetensors file ({exc})",
                          "re-save the model") from None
    data_start = 8 + length
    return {name: _Entry(file, _DTYPES[meta["dtype"]], tuple(meta["shape"]), data_start + meta["data_offsets"][0])
            for name, meta in header.items() if name != "__metadata__"}


def _json(location: Location, setting: str) -> dict:
    try:
        return json.loads(location.read_text())
    except (StorageError, ValueError) as exc:
        raise ConfigError(setting, f"{location.url} is not valid JSON ({exc})", "re-save the model") from None


def _copy_local_part(tensor: torch.Tensor, entry: _Entry, name: str, setting: str) -> int:
    if tuple(tensor.shape) != entry.shape:
        raise ConfigError(setting, f"'{name}' has shape {list(entry.shape)} in {entry.file.url}, the model "
                          f"{list(tensor.shape)}", "use the config.json saved with these weights")
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor.data
    first_row = _first_row(tensor)
    row_bytes = math.prod(entry.shape[1:]) * entry.dtype.itemsize
    nbytes = local.shape[0] * row_bytes if local.dim() else entry.dtype.itemsize
    if nbytes:
        data = entry.file.read_range(entry.start + first_row * row_bytes, nbytes)
        part = torch.frombuffer(bytearray(data), dtype=entry.dtype).reshape(local.shape)
        with torch.no_grad():
            local.copy_(part)
    return nbytes


def _first_row(tensor: torch.Tensor) -> int:
    """Global index of the first row this rank holds (FSDP2 splits dim 0 like ``torch.chunk``)."""
    if not isinstance(tensor, DTensor):
        return 0
    if any(not isinstance(p, Shard) or p.dim != 0 for p in tensor.placements):
        raise NotImplementedError(f"only row-sharded parameters are supported, got {tensor.placements}")
    rank, world = tensor.device_mesh.get_local_rank(), tensor.device_mesh.size()
    return min(rank * math.ceil(tensor.shape[0] / world), tensor.shape[0])
