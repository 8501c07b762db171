"""The safetensors file format, the one place that knows it: an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the tensors' bytes back to back.

Read by byte range (a rank fetches only the rows it holds) and written tensor by tensor (an export never holds a
second copy of the model)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch

from spotray.storage import Location

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the tensor in the file


class WeightsReader:
    """One safetensors file, opened once; its header read on opening. Raises ``ValueError`` for a file that is not
    safetensors, ``StorageError`` for one that cannot be read."""

    def __init__(self, location: Location):
        self.location = location
        self._file = location.open_input()
        (length,) = struct.unpack("<Q", self._file.read_at(8, 0))
        header = json.loads(self._file.read_at(length, 8))
        self.entries = {name: TensorEntry(DTYPES[meta["dtype"]], tuple(meta["shape"]), 8 + length
                                          + meta["data_offsets"][0])
                        for name, meta in header.items() if name != "__metadata__"}

    def rows(self, entry: TensorEntry, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first+count`` (dim 0; a scalar is one row) of a tensor, read alone."""
        row_shape = entry.shape[1:]
        row_bytes = math.prod(row_shape) * entry.dtype.itemsize
        data = bytearray(self._file.read_at(count * row_bytes, entry.start + first * row_bytes))
        return torch.frombuffer(data, dtype=entry.dtype).reshape(count, *row_shape)

    def close(self) -> None:
        self._file.close()

def write(tensors: dict[str, torch.Tensor], path: str) -> None:
    """A safetensors file at the local ``path``, written one tensor at a time, each without a copy."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            out.write(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)
