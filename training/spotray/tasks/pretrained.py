"""Pretrained weights from a Hugging Face model directory (``model.safetensors`` or a sharded index), local or S3.

Each rank reads only the bytes of the parameter rows it holds: a safetensors file starts with a JSON header giving
every tensor's dtype, shape and byte range, and an FSDP2 shard is a contiguous block of rows (``Shard(0)``)."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.tensor import DTensor, Shard

from spotray.checkpoints.safetensors_file import TensorEntry, WeightsReader
from spotray.errors import ConfigError, StorageError
from spotray.storage import Location

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
READ_THREADS = 8


def load_sharded(model: torch.nn.Module, directory: Location, setting: str) -> int:
    """Copy every parameter and persistent buffer's local part from ``directory``; returns the bytes read. The ranged
    reads run concurrently: on object storage each costs a round trip whatever its size."""
    readers = _open_files(directory, setting)
    try:
        parts = _local_parts(model, readers, directory, setting)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            fetched = pool.map(lambda p: p[1].rows(p[2], _first_row(p[0]), p[3]), parts)
            read = 0
            for (tensor, _, _, _), values in zip(parts, fetched, strict=True):
                with torch.no_grad():
                    _local(tensor).copy_(values.reshape(_local(tensor).shape))
                read += values.numel() * values.element_size()
    finally:
        for reader in readers:
            reader.close()
    return read


def check_directory(directory: Location, setting: str) -> None:
    """Fail early (on the driver) on a directory without readable weights: only the headers are read."""
    for reader in _open_files(directory, setting):
        reader.close()


def _local_parts(model: torch.nn.Module, readers: list[WeightsReader], directory: Location,
                 setting: str) -> list[tuple[torch.Tensor, WeightsReader, TensorEntry, int]]:
    """(tensor, file, entry in it, rows this rank holds) for every tensor to load."""
    entries = {name: (reader, entry) for reader in readers for name, entry in reader.entries.items()}
    tied = _tied_names(model)
    parts = []
    for name, tensor in _loadable(model):
        found = entries.get(name) or entries.get(_without_prefix(model, name))
        if found is None:
            if name in tied:
                continue
            raise ConfigError(setting, f"{directory.url} has no tensor '{name}'",
                              "point it at a directory saved from this model class (save_pretrained)")
        reader, entry = found
        if tuple(tensor.shape) != entry.shape:
            raise ConfigError(setting, f"'{name}' has shape {list(entry.shape)} in {reader.location.url}, the "
                              f"model {list(tensor.shape)}", "use the config.json saved with these weights")
        local = _local(tensor)
        if local.numel():
            parts.append((tensor, reader, entry, local.shape[0] if local.dim() else 1))
    return parts


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor.data


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


def _open_files(directory: Location, setting: str) -> list[WeightsReader]:
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
    return [_open(directory.child(name), setting) for name in files]


def _open(file: Location, setting: str) -> WeightsReader:
    try:
        return WeightsReader(file)
    except (StorageError, ValueError, KeyError) as exc:
        raise ConfigError(setting, f"{file.url} is not a readable safetensors file ({exc})",
                          "re-save the model") from None


def _json(location: Location, setting: str) -> dict:
    try:
        return json.loads(location.read_text())
    except (StorageError, ValueError) as exc:
        raise ConfigError(setting, f"{location.url} is not valid JSON ({exc})", "re-save the model") from None


def _first_row(tensor: torch.Tensor) -> int:
    """Global index of the first row this rank holds (FSDP2 splits dim 0 like ``torch.chunk``)."""
    if not isinstance(tensor, DTensor):
        return 0
    if any(not isinstance(p, Shard) or p.dim != 0 for p in tensor.placements):
        raise NotImplementedError(f"only row-sharded parameters are supported, got {tensor.placements}")
    rank, world = tensor.device_mesh.get_local_rank(), tensor.device_mesh.size()
    return min(rank * math.ceil(tensor.shape[0] / world), tensor.shape[0])
