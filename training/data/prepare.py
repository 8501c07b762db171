"""Turn text files into fixed-size binary token shards plus an ``index.json``."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterator

import numpy as np

from training.data.tokenizer import load_tokenizer
from training.errors import DataError
from training.storage import Location, StorageOptions, resolve

FORMAT = "spotray-tokens"
VERSION = 1
INDEX_NAME = "index.json"
TOKENIZER_NAME = "tokenizer.json"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.bin"


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def prepare(
    inputs: str,
    output_url: str,
    tokenizer: str = "bytes",
    shard_tokens: int = 1 << 20,
    options: StorageOptions | None = None,
) -> dict:
    """Tokenize ``inputs`` (a file, directory or glob) into shards at ``output_url``; returns the index."""
    if shard_tokens < 1:
        raise DataError(f"shard_tokens must be at least 1, got {shard_tokens}")
    out = resolve(output_url, options)
    index_loc = out.child(INDEX_NAME)
    if index_loc.exists():
        raise DataError(
            f"{index_loc.url} already exists: refusing to overwrite a prepared dataset; "
            "choose another --output or delete it first"
        )
    files = _input_files(inputs)
    tok = load_tokenizer(tokenizer, options)
    dtype_name = dtype_for_vocab(tok.vocab_size)
    writer = _ShardWriter(out, shard_tokens, DTYPES[dtype_name])
    num_documents = 0
    for text in _documents(files):
        writer.add(tok.encode(text))
        writer.add(np.array([tok.eot_token]))
        num_documents += 1
    if num_documents == 0:
        raise DataError(f"empty corpus: {inputs} contains no text; point --input at non-empty text files")
    writer.flush()
    if tok.file is not None:
        out.child(TOKENIZER_NAME).write_bytes(tok.file)
    index = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype_name,
        "tokenizer": tok.tokenizer_id,
        "vocab_size": tok.vocab_size,
        "eot_token": tok.eot_token,
        "shard_tokens": shard_tokens,
        "total_tokens": writer.total_tokens,
        "num_documents": num_documents,
        "tokenizer_file": TOKENIZER_NAME if tok.file is not None else None,
        "shards": writer.shards,
    }
    # Written last: a dataset is readable only once every shard it lists is in place.
    index_loc.write_text(json.dumps(index, indent=2) + "\n")
    return index


def _input_files(inputs: str) -> list[str]:
    pattern = os.path.expanduser(inputs)
    if os.path.isfile(pattern):
        return [pattern]
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, "**", "*")
    files = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not files:
        raise DataError(
            f"no input files matched '{inputs}': give a text file, a directory or a glob like 'data/**/*.txt'"
        )
    return files


def _documents(files: list[str]) -> Iterator[str]:
    """One document per non-empty file, read one at a time."""
    for path in files:
        text = resolve(path).read_bytes().decode("utf-8", errors="replace")
        if text:
            yield text


class _ShardWriter:
    """Buffers at most one shard of tokens and writes each full shard as soon as it fills."""

    def __init__(self, out: Location, shard_tokens: int, dtype: np.dtype):
        self.out = out
        self.buffer = np.empty(shard_tokens, dtype=dtype)
        self.filled = 0
        self.total_tokens = 0
        self.shards: list[dict] = []

    def add(self, tokens: np.ndarray) -> None:
        while len(tokens):
            n = min(len(tokens), len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + n] = tokens[:n]
            self.filled += n
            tokens = tokens[n:]
            if self.filled == len(self.buffer):
                self.flush()

    def flush(self) -> None:
        if not self.filled:
            return
        data = self.buffer[: self.filled].tobytes()
        name = shard_name(len(self.shards))
        self.out.child(name).write_bytes(data)
        self.shards.append({"name": name, "tokens": self.filled, "sha256": hashlib.sha256(data).hexdigest()})
        self.total_tokens += self.filled
        self.filled = 0
