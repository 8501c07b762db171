"""Read fixed-length training samples from token shards written by ``prepare``."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from spotray.data.index import DTYPES, read_index
from spotray.errors import DataError
from spotray.storage import Location, StorageOptions, resolve

S3_READ_THREADS = 8


class TokenDataset:
    """Non-overlapping windows of ``seq_len + 1`` tokens (inputs plus shifted targets), shard-major.

    Shards are opened lazily, so the dataset pickles cheaply and can be rebuilt from its URL in any worker.
    """

    def __init__(self, url: str, seq_len: int, index: dict, options: StorageOptions | None = None):
        self.url = url
        self.seq_len = seq_len
        self.options = options
        self.index = index
        self._dtype = DTYPES[index["dtype"]]
        self._shards: list[dict] = index["shards"]
        self._ends = np.cumsum([max(s["tokens"] - 1, 0) // seq_len for s in self._shards])
        self._is_s3 = resolve(url, options).is_s3
        self._open: dict[int, object] = {}
        self._lock = threading.Lock()
        if self.num_samples == 0:
            raise DataError(
                f"dataset {url} has fewer tokens than seq_len+1 = {seq_len + 1} in every shard "
                f"({index['total_tokens']} tokens in all): lower train.seq_len or add data"
            )

    @classmethod
    def open(cls, url: str, seq_len: int, options: StorageOptions | None = None) -> TokenDataset:
        """Read and validate ``index.json`` only; shards are touched when samples are read."""
        if seq_len < 1:
            raise DataError(f"seq_len must be at least 1, got {seq_len}")
        index = read_index(resolve(url, options))
        return cls(url, seq_len, index, options)

    @property
    def num_samples(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def vocab_size(self) -> int:
        return self.index["vocab_size"]

    @property
    def eot_token(self) -> int:
        return self.index["eot_token"]

    @property
    def tokenizer(self) -> str:
        return self.index["tokenizer"]

    @property
    def tokenizer_files(self) -> dict[str, Location]:
        """The copies of the HuggingFace tokenizer the data was prepared with, by file name: its tokenizer.json and
        the companion files found beside it (none for the byte tokenizer)."""
        root = resolve(self.url, self.options)
        stored = self.index.get("tokenizer_file")
        companions = self.index.get("tokenizer_companions", [])
        files = ({"tokenizer.json": stored} if stored else {}) | {name: name for name in companions}
        return {name: root.child(path) for name, path in files.items()}

    def __len__(self) -> int:
        return self.num_samples

    def sample(self, i: int) -> np.ndarray:
        """Tokens ``[j*seq_len, j*seq_len + seq_len + 1)`` of the shard holding global sample ``i``, as int64."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range for a dataset of {self.num_samples} samples")
        k = bisect.bisect_right(self._ends, i)
        start = (i - (int(self._ends[k - 1]) if k else 0)) * self.seq_len
        n = self.seq_len + 1
        shard = self._shard(k)
        if isinstance(shard, np.memmap):
            return np.array(shard[start : start + n], dtype=np.int64)
        itemsize = self._dtype.itemsize
        data = shard.read_at(n * itemsize, start * itemsize)
        if len(data) != n * itemsize:
            raise DataError(f"shard {self._shards[k]['name']} at {self.url} is truncated: re-run prepare")
        return np.frombuffer(data, dtype=self._dtype).astype(np.int64)

    def batch(self, ids: Sequence[int]) -> torch.Tensor:
        """Samples ``ids`` stacked into an int64 tensor of shape ``[len(ids), seq_len + 1]``."""
        if self._is_s3 and len(ids) > 1:
            with ThreadPoolExecutor(min(S3_READ_THREADS, len(ids))) as pool:
                rows = list(pool.map(self.sample, ids))
        else:
            rows = [self.sample(i) for i in ids]
        if not rows:
            return torch.empty((0, self.seq_len + 1), dtype=torch.int64)
        return torch.from_numpy(np.stack(rows))

    def _shard(self, k: int):
        """The memory map (local) or open ranged-read file (S3) of shard ``k``, opened on first use."""
        shard = self._open.get(k)
        if shard is not None:
            return shard
        with self._lock:
            if k not in self._open:
                self._open[k] = self._open_shard(k)
            return self._open[k]

    def _open_shard(self, k: int):
        meta = self._shards[k]
        loc: Location = resolve(self.url, self.options).child(meta["name"])
        if not loc.exists():
            raise DataError(f"shard {meta['name']} is missing from {self.url}: re-run prepare")
        expected = meta["tokens"] * self._dtype.itemsize
        if loc.is_s3:
            shard = loc.open_input()
            actual = shard.size()
        else:
            actual = loc.size()
        if actual != expected:
            raise DataError(f"shard {meta['name']} has {actual} bytes, index says {expected}: re-run prepare")
        if loc.is_s3:
            return shard
        return np.memmap(loc.path, dtype=self._dtype, mode="r", shape=(meta["tokens"],))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_open"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
