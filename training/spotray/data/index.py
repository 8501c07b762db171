"""A prepared dataset's ``index.json``: its format, and the checks a reader makes before trusting it.

The index is written last by ``prepare`` and is the only thing that makes a dataset visible."""

from __future__ import annotations

import json

import numpy as np

from spotray.errors import DataError, StorageError
from spotray.storage import Location

FORMAT = "spotray-tokens"
VERSION = 1
INDEX_NAME = "index.json"
TOKENIZER_NAME = "tokenizer.json"
VAL_NAME = "val"
DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def val_split_url(data_url: str) -> str:
    """Where ``prepare --val-fraction`` puts the validation split of the dataset at ``data_url``."""
    return f"{data_url.rstrip('/')}/{VAL_NAME}"


def read_index(root: Location) -> dict:
    """The validated index of the dataset at ``root``; ``index["tokenizer"]`` identifies the tokenizer it was
    prepared with (``bytes``, or ``hf:`` and a hash of its tokenizer.json)."""
    index_loc = root.child(INDEX_NAME)
    try:
        data = index_loc.read_bytes()
    except StorageError:
        if index_loc.exists():
            raise
        raise DataError(f"no index.json at {root.url}: run `spotray prepare --input ... --output {root.url}` first")\
            from None
    try:
        index = json.loads(data)
    except ValueError as exc:
        raise DataError(f"{index_loc.url} is not valid JSON ({exc}): re-run prepare") from None
    validate_index(index, index_loc.url)
    return index


def validate_index(index: object, where: str) -> None:
    def bad(field: str, problem: str) -> DataError:
        return DataError(f"{where}: field '{field}' {problem}: re-run prepare")

    if not isinstance(index, dict):
        raise DataError(f"{where}: expected a JSON object: re-run prepare")
    if index.get("format") != FORMAT:
        raise bad("format", f"is {index.get('format')!r}, expected {FORMAT!r}")
    if index.get("version") != VERSION:
        raise bad("version", f"is {index.get('version')!r}; this version of spotray reads only version {VERSION}")
    dtype = index.get("dtype")
    if dtype not in DTYPES:
        raise bad("dtype", f"is {dtype!r}, expected one of {sorted(DTYPES)}")
    for field in ("vocab_size", "eot_token", "total_tokens"):
        value = index.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(field, f"must be a non-negative integer, got {value!r}")
    if index["vocab_size"] > 1 << (8 * DTYPES[dtype].itemsize):
        raise bad("dtype", f"{dtype} cannot hold vocab_size {index['vocab_size']}")
    if index["eot_token"] >= index["vocab_size"]:
        raise bad("eot_token", f"{index['eot_token']} is outside vocab_size {index['vocab_size']}")
    if not isinstance(index.get("tokenizer"), str):
        raise bad("tokenizer", "must be a string")
    tokenizer_file = index.get("tokenizer_file")
    if tokenizer_file is not None and not (isinstance(tokenizer_file, str) and _relative_name(tokenizer_file)):
        raise bad("tokenizer_file", f"must be a file name inside the dataset or null, got {tokenizer_file!r}")
    companions = index.get("tokenizer_companions", [])
    if not (isinstance(companions, list) and all(isinstance(n, str) and _relative_name(n) for n in companions)):
        raise bad("tokenizer_companions", f"must be a list of file names inside the dataset, got {companions!r}")
    shards = index.get("shards")
    if not isinstance(shards, list) or not all(_valid_shard(s) for s in shards):
        raise bad("shards", "must be a list of {name, tokens, sha256} entries with names inside the dataset")
    if sum(s["tokens"] for s in shards) != index["total_tokens"]:
        raise bad("shards", f"token counts do not add up to total_tokens {index['total_tokens']}")
    if "val" in index and not _valid_val(index["val"]):
        raise bad("val", f"must name the validation split's directory inside the dataset, got {index['val']!r}")


def _valid_shard(shard: object) -> bool:
    return (
        isinstance(shard, dict)
        and isinstance(shard.get("name"), str)
        and _relative_name(shard["name"])
        and isinstance(shard.get("tokens"), int)
        and shard["tokens"] >= 0
        and isinstance(shard.get("sha256"), str)
    )


def _valid_val(val: object) -> bool:
    return isinstance(val, dict) and isinstance(val.get("path"), str) and _relative_name(val["path"])


def _relative_name(name: str) -> bool:
    """A path below the dataset's root: no absolute path, no empty, ``.`` or ``..`` part."""
    return all(part not in ("", ".", "..") for part in name.split("/"))
