"""The safetensors reader and writer against the ``safetensors`` library itself."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from spotray.checkpoints import safetensors_file
from spotray.storage import resolve

TENSORS = {"w": torch.arange(12, dtype=torch.float32).reshape(4, 3), "b": torch.tensor([1.5, -2.0]).bfloat16(),
           "step": torch.tensor(7, dtype=torch.int64)}


def test_written_files_load_with_safetensors(tmp_path):
    safetensors_file.write(TENSORS, str(tmp_path / "w.safetensors"))
    loaded = load_file(tmp_path / "w.safetensors")
    assert loaded.keys() == TENSORS.keys() and all(torch.equal(loaded[k], TENSORS[k]) for k in TENSORS)


def test_rows_are_read_alone_from_a_safetensors_file(tmp_path):
    save_file(TENSORS, str(tmp_path / "w.safetensors"))
    reader = safetensors_file.WeightsReader(resolve(str(tmp_path / "w.safetensors")))
    assert torch.equal(reader.rows(reader.entries["w"], 1, 2), TENSORS["w"][1:3])
    assert torch.equal(reader.rows(reader.entries["b"], 0, 2), TENSORS["b"])
    assert torch.equal(reader.rows(reader.entries["step"], 0, 1).reshape(()), TENSORS["step"])
    reader.close()
