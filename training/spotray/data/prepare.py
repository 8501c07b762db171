"""``spotray prepare``: corpora of text, JSON Lines or Parquet files (local or s3://) into token shards and an
``index.json``, and ``--verify`` of a prepared dataset.

The inputs are planned into chunks (``sources``); each chunk is one task (``chunks``) that writes its own shards
and manifest, on Ray or in this process (``executors``); with dedup, chunks that repeat an earlier chunk's
documents are rewritten without them; then the index lists every shard in input order and is written last. The
output depends only on the inputs and settings, never on the parallelism or the order tasks finish in.

With ``val_fraction``, the documents whose text hash falls in that fraction of the hash space form a validation
dataset at ``<output>/val``, with its own index, written before the training index that makes both visible.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from spotray.data import FORMATS
from spotray.data.chunks import (
    ChunkJob,
    ChunkSettings,
    CompactJob,
    compact_chunk,
    finished_manifest,
    read_docs,
    shard_files,
    tokenize_chunk,
)
from spotray.data.executors import InlineExecutor
from spotray.data.index import (
    DTYPES,
    FORMAT,
    INDEX_NAME,
    TOKENIZER_NAME,
    VAL_NAME,
    VERSION,
    dtype_for_vocab,
    read_index,
    val_split_url,
)
from spotray.data.prepare_progress import PrepareProgress
from spotray.data.sources import IO_THREADS, list_inputs, plan_chunks
from spotray.data.tokenizer import Tokenizer, load_tokenizer
from spotray.errors import DataError, StorageError
from spotray.storage import Location, StorageOptions, resolve

VERIFY_BLOCK = 8 << 20


@dataclass(frozen=True)
class PrepareSettings:
    tokenizer: str = "bytes"
    format: str = "auto"
    text_field: str = "text"
    min_chars: int = 1
    dedup: bool = True
    skip_bad_lines: bool = False
    shard_tokens: int = 1 << 20
    chunk_mb: float = 16.0  # 4+ chunks per CPU on a 1 GB corpus: the last tasks do not leave a CPU idle for long
    val_fraction: float | None = None

    def __post_init__(self):
        if self.format not in FORMATS:
            raise DataError(f"--format '{self.format}' is not one of {', '.join(FORMATS)}")
        if not self.text_field:
            raise DataError("--text-field is empty: name the field (JSONL) or column (Parquet) holding the text")
        if self.min_chars < 0:
            raise DataError(f"--min-chars must be 0 or more, got {self.min_chars}")
        if self.shard_tokens < 1:
            raise DataError(f"shard_tokens must be at least 1, got {self.shard_tokens}")
        if not self.chunk_mb > 0:
            raise DataError(f"--chunk-mb must be more than 0, got {self.chunk_mb}")
        if self.val_fraction is not None and not (_is_number(self.val_fraction) and 0 < self.val_fraction <= 0.5):
            raise DataError(f"--val-fraction must be a number more than 0 and at most 0.5, got {self.val_fraction!r}: "
                            "give the share of documents to hold out for validation (e.g. 0.01), or leave it out")

    @property
    def chunk_bytes(self) -> int:
        return max(1, int(self.chunk_mb * (1 << 20)))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def prepare(
    inputs: str | Sequence[str],
    output_url: str,
    options: StorageOptions | None = None,
    executor=None,
    progress_stream=None,
    **fields,
) -> dict:
    """Tokenize ``inputs`` (files, directories, globs, s3:// prefixes) into shards at ``output_url``; returns the
    index. ``fields`` are ``PrepareSettings`` fields; ``executor`` defaults to this process, one chunk at a time."""
    settings = PrepareSettings(**fields)
    patterns = [inputs] if isinstance(inputs, str) else list(inputs)
    out = resolve(output_url, options)
    if out.child(INDEX_NAME).exists():
        raise DataError(
            f"{out.child(INDEX_NAME).url} already exists: refusing to overwrite a prepared dataset; "
            "choose another --output or delete it first"
        )
    files = [f for f in list_inputs(patterns, settings.format, options) if not f.url.startswith(f"{out.url}/")]
    if not files:
        raise DataError(f"every file --input names is inside --output {out.url}: point --input at the corpus")
    out.check_writable()  # before a corpus is read and tokenized for nothing
    tokenizer = load_tokenizer(settings.tokenizer, options)
    chunk_settings = ChunkSettings(settings.text_field, settings.min_chars, settings.dedup, settings.skip_bad_lines,
                                   settings.shard_tokens, dtype_for_vocab(tokenizer.vocab_size),
                                   tokenizer.tokenizer_id, tokenizer.eot_token, settings.val_fraction)
    jobs = [ChunkJob(k, tuple(pieces), chunk_settings, out.url, options)
            for k, pieces in enumerate(plan_chunks(files, settings.chunk_bytes, options))]
    executor = executor or InlineExecutor()
    progress = PrepareProgress(sum(piece.size for job in jobs for piece in job.pieces), progress_stream)
    try:
        manifests = _run(tokenize_chunk, jobs, tokenizer, out, executor, progress)
    finally:
        progress.close()
    superseded = [m["docs"] for m in manifests.values() if m["docs"]]
    if settings.dedup:
        compacted = _drop_repeats(jobs, manifests, out, executor)
        superseded += [name for number in compacted for name in shard_files(manifests[number])]
        manifests |= compacted
    ordered = [manifests[job.number] for job in jobs]
    val_index = _val_index(settings, tokenizer, ordered) if settings.val_fraction is not None else None
    index = _index(settings, patterns, tokenizer, ordered, val_index)
    _check_not_empty(index, val_index, patterns)
    if val_index is not None:
        _write_dataset_files(out.child(VAL_NAME), val_index, tokenizer)
    # The training index last: a dataset, and its val split, are readable only once every shard is in place.
    _write_dataset_files(out, index, tokenizer)
    with ThreadPoolExecutor(IO_THREADS) as pool:  # the dedup hash lists, and the shards that dedup rewrote
        list(pool.map(lambda name: out.child(name).delete_file(), superseded))
    return index


def _run(fn: Callable, jobs: list, tokenizer, out: Location, executor, progress: PrepareProgress | None) -> dict:
    """Run the jobs that an earlier run has not finished; the manifests of all jobs, by chunk number."""
    with ThreadPoolExecutor(IO_THREADS) as pool:
        found = list(pool.map(lambda job: finished_manifest(job, out), jobs))
    manifests = {job.number: m for job, m in zip(jobs, found, strict=True) if m is not None}
    todo = [job for job in jobs if job.number not in manifests]
    if progress is not None:
        for m in manifests.values():
            progress.chunk_done(*_processed(m))
        if manifests:
            progress.stream.write(f"prepare: {len(manifests)} of {len(jobs)} chunks were done by an earlier run; "
                                  f"doing the other {len(todo)}\n")

    def on_done(job, manifest: dict) -> None:
        manifests[job.number] = manifest
        if progress is not None:
            progress.chunk_done(*_processed(manifest))

    executor.run(fn, todo, tokenizer, on_done, progress.update if progress is not None else _ignore)
    return manifests


def _write_dataset_files(root: Location, index: dict, tokenizer: Tokenizer) -> None:
    tokenizer_files = {TOKENIZER_NAME: tokenizer.file} if tokenizer.file is not None else {}
    for name, data in (tokenizer_files | tokenizer.companions).items():
        root.child(name).write_bytes(data)
    root.child(INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def _ignore(*_counts: int) -> None:
    pass


def _processed(manifest: dict) -> tuple[int, int, int]:
    """The documents and tokens of both splits, and the input bytes, of a finished chunk: what the live line counts."""
    val = manifest["val"] or {"documents": 0, "tokens": 0}
    return manifest["documents"] + val["documents"], manifest["tokens"] + val["tokens"], manifest["bytes_in"]


def _drop_repeats(jobs: list[ChunkJob], manifests: dict, out: Location, executor) -> dict:
    """Rewrite each chunk holding documents an earlier chunk holds (same normalised text) without them; the new
    manifests by chunk number."""
    with ThreadPoolExecutor(IO_THREADS) as pool:
        docs = list(pool.map(lambda job: read_docs(out, manifests[job.number]), jobs))
    offsets = np.cumsum([0] + [len(d) for d in docs])
    hi = np.concatenate([d["hi"] for d in docs])
    lo = np.concatenate([d["lo"] for d in docs])
    order = np.lexsort((lo, hi))  # stable: among equal hashes, the earliest document comes first
    same = (hi[order][1:] == hi[order][:-1]) & (lo[order][1:] == lo[order][:-1])
    repeats = np.sort(order[1:][same])
    chunk_of = np.searchsorted(offsets, repeats, side="right") - 1
    compactions = [
        CompactJob(jobs[k], manifests[jobs[k].number], tuple((repeats[chunk_of == k] - offsets[k]).tolist()))
        for k in np.unique(chunk_of)
    ]
    return _run(compact_chunk, compactions, None, out, executor, None)


def _header(settings: PrepareSettings, tokenizer) -> dict:
    """What a reader needs to decode the tokens: the same for the training and the validation split."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype_for_vocab(tokenizer.vocab_size),
        "tokenizer": tokenizer.tokenizer_id,
        "vocab_size": tokenizer.vocab_size,
        "eot_token": tokenizer.eot_token,
        "shard_tokens": settings.shard_tokens,
    }


def _index(settings: PrepareSettings, patterns: list[str], tokenizer: Tokenizer, manifests: list[dict],
           val_index: dict | None) -> dict:
    shards = [s for m in manifests for s in m["shards"]]
    index = {
        **_header(settings, tokenizer),
        "total_tokens": sum(s["tokens"] for s in shards),
        "num_documents": sum(m["documents"] for m in manifests),
        "removed": {k: sum(m["removed"][k] for m in manifests) for k in ("short", "duplicates", "bad_lines")},
        "bytes_in": sum(m["bytes_in"] for m in manifests),
        "tokenizer_file": TOKENIZER_NAME if tokenizer.file is not None else None,
        "tokenizer_companions": sorted(tokenizer.companions),
        "source": {"inputs": patterns, **{k: v for k, v in asdict(settings).items() if k != "tokenizer"}},
    }
    if val_index is not None:
        index["val"] = {"fraction": val_index["fraction"], "path": VAL_NAME, "documents": val_index["num_documents"],
                        "tokens": val_index["total_tokens"]}
    return index | {"shards": shards}


def _val_index(settings: PrepareSettings, tokenizer: Tokenizer, manifests: list[dict]) -> dict:
    splits = [m["val"] for m in manifests]
    shards = [s for split in splits for s in split["shards"]]
    return {
        **_header(settings, tokenizer),
        "split": "val",
        "fraction": settings.val_fraction,
        "total_tokens": sum(s["tokens"] for s in shards),
        "num_documents": sum(split["documents"] for split in splits),
        "tokenizer_file": TOKENIZER_NAME if tokenizer.file is not None else None,
        "tokenizer_companions": sorted(tokenizer.companions),
        "shards": shards,
    }


def _check_not_empty(index: dict, val_index: dict | None, patterns: list[str]) -> None:
    val_documents = val_index["num_documents"] if val_index is not None else 0
    if index["num_documents"] + val_documents == 0:
        raise DataError(f"empty corpus: {', '.join(patterns)} contains no text ({_removed_text(index['removed'])}); "
                        "point --input at files with text")
    if index["num_documents"] == 0:
        assert val_index is not None, "else the corpus is empty, caught above"
        raise DataError(f"--val-fraction {val_index['fraction']} put all {val_documents} documents into the "
                        "validation split and none is left to train on: add data or lower --val-fraction")
    if val_index is not None and val_documents == 0:
        raise DataError(f"--val-fraction {val_index['fraction']} put none of the {index['num_documents']} documents "
                        "into the validation split: raise --val-fraction or add data")


def _removed_text(removed: dict) -> str:
    return (f"{removed['short']} documents empty or shorter than --min-chars, {removed['duplicates']} duplicates, "
            f"{removed['bad_lines']} bad lines skipped")


def verify(url: str, options: StorageOptions | None = None) -> dict:
    """Re-read every shard the index lists, and those of its val split, and check their sizes and SHA-256s; names
    every damaged one."""
    root = resolve(url, options)
    index = read_index(root)
    problems = _shard_problems(root, index)
    count = len(index["shards"])
    val_index = None
    if "val" in index:
        val_root = root.child(index["val"]["path"])
        val_index = _matching_val_index(val_root, index)
        problems += [f"{index['val']['path']}/{p}" for p in _shard_problems(val_root, val_index)]
        count += len(val_index["shards"])
    if problems:
        shown = ", ".join(problems[:10]) + (f" and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise DataError(f"{root.url}: {len(problems)} of {count} shards are damaged: {shown}; "
                        "prepare the data again into a new --output")
    return _verified(index) | ({"val": _verified(val_index)} if val_index is not None else {})


def _matching_val_index(val_root: Location, index: dict) -> dict:
    val_index = read_index(val_root)
    for field in ("tokenizer", "dtype", "vocab_size", "eot_token"):
        if val_index[field] != index[field]:
            raise DataError(f"{val_root.url}: the validation split's {field} {val_index[field]!r} differs from the "
                            f"training split's {index[field]!r}: prepare the data again into a new --output")
    return val_index


def _shard_problems(root: Location, index: dict) -> list[str]:
    itemsize = DTYPES[index["dtype"]].itemsize
    with ThreadPoolExecutor(IO_THREADS) as pool:
        return [p for p in pool.map(lambda s: _shard_problem(root, s, itemsize), index["shards"]) if p]


def _verified(index: dict) -> dict:
    itemsize = DTYPES[index["dtype"]].itemsize
    return {"shards": len(index["shards"]), "tokens": index["total_tokens"], "bytes": index["total_tokens"] * itemsize}


def _shard_problem(root: Location, shard: dict, itemsize: int) -> str | None:
    loc = root.child(shard["name"])
    expected = shard["tokens"] * itemsize
    digest, size = hashlib.sha256(), 0
    try:
        with loc.open_input() as f:
            while block := f.read(VERIFY_BLOCK):
                digest.update(block)
                size += len(block)
    except StorageError:
        return f"{shard['name']} (missing)"
    if size != expected:
        return f"{shard['name']} (has {size} bytes, the index says {expected})"
    if digest.hexdigest() != shard["sha256"]:
        return f"{shard['name']} (SHA-256 differs from the index: corrupted)"
    return None


def describe(index: dict, wall_s: float, out_url: str) -> str:
    """The summary line of a finished prepare."""
    bytes_out = index["total_tokens"] * DTYPES[index["dtype"]].itemsize
    val = index.get("val")
    held_out = (f"; held out {val['tokens']:,} tokens from {val['documents']:,} documents for validation at "
                f"{val_split_url(out_url)}" if val else "")
    return (f"prepared {index['total_tokens']:,} tokens from {index['num_documents']:,} documents into "
            f"{len(index['shards'])} shards at {out_url}{held_out}: {index['bytes_in'] / 1e6:,.1f} MB in, "
            f"{bytes_out / 1e6:,.1f} MB out, {wall_s:.1f} s; removed {_removed_text(index['removed'])}")

