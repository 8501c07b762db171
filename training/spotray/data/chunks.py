"""One chunk of a prepare, as one task: its documents filtered, tokenized and written as shards under
``chunks/cNNNNNN/``, then its manifest.

The manifest is written last and lists every shard with its SHA-256: a chunk is done only through it, so a prepare
that was killed redoes the chunks without one and never adopts a partial shard. With dedup, the manifest also
points at ``docs.bin`` (each kept document's text hash and end), from which the driver finds documents that
repeat an earlier chunk's; such a chunk is rewritten without them into ``chunks/cNNNNNN/dedup-<hash>/``.

With a validation fraction, the documents whose hash falls below ``val_threshold`` go to the same paths under
``val/`` instead, and the manifest's ``val`` lists those shards (named from ``val/``, as the val index names them).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np

from spotray.data.index import DTYPES, VAL_NAME
from spotray.data.sources import DocumentReader, Piece
from spotray.data.tokenizer import Tokenizer
from spotray.errors import StorageError
from spotray.storage import Location, StorageOptions, resolve

CHUNKS_DIR = "chunks"
MANIFEST = "manifest.json"
DOCS = "docs.bin"
DOC_RECORD = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("end", "<u8")])
BATCH_CHARS = 1 << 20
REPORT_EVERY_S = 1.0

# documents, tokens, input bytes so far in this task
Report = Callable[[int, int, int], None]


@dataclass(frozen=True)
class ChunkSettings:
    """Everything besides the input that decides a chunk's output; part of its fingerprint."""

    text_field: str
    min_chars: int
    dedup: bool
    skip_bad_lines: bool
    shard_tokens: int
    dtype: str
    tokenizer_id: str
    eot_token: int  # a tokenizer_config.json beside the same tokenizer.json may name another
    val_fraction: float | None

    @property
    def val_threshold(self) -> int:
        """A document is in the validation split when the first 8 bytes of its hash, as a little-endian integer,
        are below this: the split depends on the text alone, never on the chunking."""
        return int(self.val_fraction * 2**64) if self.val_fraction else 0


@dataclass(frozen=True)
class ChunkJob:
    number: int
    pieces: tuple[Piece, ...]
    settings: ChunkSettings
    output_url: str
    options: StorageOptions | None = None

    @property
    def directory(self) -> str:
        return f"{CHUNKS_DIR}/c{self.number:06d}"

    def fingerprint(self) -> str:
        spec = {"pieces": [asdict(p) for p in self.pieces], "settings": asdict(self.settings)}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CompactJob:
    """Rewrite a finished chunk without the documents (ordinals among its kept ones) that an earlier chunk holds."""

    chunk: ChunkJob
    manifest: dict
    drop: tuple[int, ...]

    @property
    def number(self) -> int:
        return self.chunk.number

    @property
    def settings(self) -> ChunkSettings:
        return self.chunk.settings

    @property
    def directory(self) -> str:
        return f"{self.chunk.directory}/dedup-{self.fingerprint()[:12]}"

    def fingerprint(self) -> str:
        spec = [self.chunk.fingerprint(), list(self.drop)]
        return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


def document_digest(text: str) -> bytes:
    """128-bit hash of the text with runs of whitespace made one space: copies differing only in spacing match."""
    return hashlib.blake2b(" ".join(text.split()).encode("utf-8"), digest_size=16).digest()


def tokenize_chunk(job: ChunkJob, tokenizer: Tokenizer, report: Report) -> dict:
    """Read, filter, dedup (within the chunk), split and tokenize the chunk's documents; returns its manifest."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one task, one core: the parallelism is the tasks'
    settings = job.settings
    out = resolve(job.output_url, job.options)
    reader = DocumentReader(settings.text_field, settings.skip_bad_lines, job.options)
    threshold = settings.val_threshold
    train = _SplitWriter(tokenizer, ShardWriter(out, job.directory, settings.shard_tokens, DTYPES[settings.dtype]))
    val = _SplitWriter(tokenizer, ShardWriter(out.child(VAL_NAME), job.directory, settings.shard_tokens,
                                              DTYPES[settings.dtype]))
    hashed = settings.dedup or threshold > 0
    seen: set[bytes] = set()
    digests: list[bytes] = []
    short = duplicates = 0
    reported = time.monotonic()

    def counts() -> tuple[int, int, int]:
        return (train.documents + val.documents, train.writer.position + val.writer.position,
                reader.stats.bytes_in)

    for piece in job.pieces:
        for text in reader.documents(piece):
            if not text or len(text) < settings.min_chars:
                short += 1
                continue
            digest = document_digest(text) if hashed else b""
            if settings.dedup:
                if digest in seen:
                    duplicates += 1
                    continue
                seen.add(digest)
                digests.append(digest)
            (val if _hash_head(digest) < threshold else train).add(text)
            if time.monotonic() - reported >= REPORT_EVERY_S:
                report(*counts())
                reported = time.monotonic()
    train.flush()
    val.flush()
    docs_name = _write_docs(out, job.directory, digests, threshold, train.ends, val.ends) if settings.dedup else None
    manifest = {
        "fingerprint": job.fingerprint(),
        "documents": train.documents,
        "tokens": train.writer.position,
        "bytes_in": reader.stats.bytes_in,
        "removed": {"short": short, "duplicates": duplicates, "bad_lines": reader.stats.bad_lines},
        "shards": train.writer.shards,
        "docs": docs_name,
        "val": val.summary() if threshold else None,
    }
    report(*counts())
    out.child(job.directory, MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _hash_head(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little")


class _SplitWriter:
    """One split's documents of a chunk: batched for the tokenizer, written as shards as they fill."""

    def __init__(self, tokenizer: Tokenizer, writer: ShardWriter):
        self.tokenizer, self.writer = tokenizer, writer
        self.batch: list[str] = []
        self.batch_chars = 0
        self.documents = 0
        self._ends: list[np.ndarray] = []

    def add(self, text: str) -> None:
        self.batch.append(text)
        self.batch_chars += len(text)
        if self.batch_chars >= BATCH_CHARS:
            self._encode_batch()

    def flush(self) -> None:
        if self.batch:
            self._encode_batch()
        self.writer.flush()

    def _encode_batch(self) -> None:
        tokens, lengths = self.tokenizer.encode_documents(self.batch)
        self._ends.append(self.writer.position + np.cumsum(lengths))
        self.writer.add(tokens)
        self.documents += len(self.batch)
        self.batch.clear()
        self.batch_chars = 0

    @property
    def ends(self) -> np.ndarray:
        """Where each document's tokens end, in the order added."""
        return np.concatenate(self._ends) if self._ends else np.empty(0, dtype=np.int64)

    def summary(self) -> dict:
        return {"documents": self.documents, "tokens": self.writer.position, "shards": self.writer.shards}


def _write_docs(out: Location, directory: str, digests: list[bytes], threshold: int, train_ends: np.ndarray,
                val_ends: np.ndarray) -> str:
    """Each document's hash and, in input order, where it ends in its own split's tokens."""
    records = np.empty(len(digests), dtype=DOC_RECORD)
    if digests:
        pairs = np.frombuffer(b"".join(digests), dtype="<u8").reshape(-1, 2)
        records["hi"], records["lo"] = pairs[:, 0], pairs[:, 1]
        in_val = records["hi"] < threshold
        records["end"][~in_val] = train_ends
        records["end"][in_val] = val_ends
    name = f"{directory}/{DOCS}"
    out.child(name).write_bytes(records.tobytes())
    return name


def read_docs(out: Location, manifest: dict) -> np.ndarray:
    return np.frombuffer(out.child(manifest["docs"]).read_bytes(), dtype=DOC_RECORD)


def compact_chunk(job: CompactJob, _tokenizer: Tokenizer, _report: Report) -> dict:
    """Copy the chunk's tokens, of each split, without the dropped documents' spans; returns the new manifest."""
    out = resolve(job.chunk.output_url, job.chunk.options)
    records = read_docs(out, job.manifest)
    dropped = np.zeros(len(records), dtype=bool)
    dropped[list(job.drop)] = True
    in_val = records["hi"] < job.settings.val_threshold
    train = _rewrite(out, job, job.manifest, records["end"][~in_val], dropped[~in_val])
    removed = dict(job.manifest["removed"])
    removed["duplicates"] += len(job.drop)
    manifest = {**job.manifest, "fingerprint": job.fingerprint(), "removed": removed, "docs": None, **train}
    if job.manifest["val"] is not None:
        manifest["val"] = _rewrite(out.child(VAL_NAME), job, job.manifest["val"], records["end"][in_val],
                                   dropped[in_val])
    out.child(job.directory, MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _rewrite(root: Location, job: CompactJob, split: dict, ends: np.ndarray, dropped: np.ndarray) -> dict:
    """One split's shards (``split``: its documents, tokens and shards) copied under the job's directory without
    the documents ``dropped`` marks; ``ends`` says where each document ends."""
    dtype = DTYPES[job.settings.dtype]
    ends = ends.astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    stream = _TokenStream(root, split["shards"], dtype)
    writer = ShardWriter(root, job.directory, job.settings.shard_tokens, dtype)
    for ordinal in np.flatnonzero(dropped):
        for tokens in stream.take(int(starts[ordinal]) - stream.position):
            writer.add(tokens)
        stream.skip(int(ends[ordinal]) - stream.position)
    for tokens in stream.take(split["tokens"] - stream.position):
        writer.add(tokens)
    writer.flush()
    return {"documents": split["documents"] - int(dropped.sum()), "tokens": writer.position, "shards": writer.shards}


def shard_files(manifest: dict) -> dict[str, int]:
    """Every shard a manifest lists, of both splits, by its path under the output: its tokens."""
    val = manifest["val"]["shards"] if manifest["val"] is not None else []
    return {s["name"]: s["tokens"] for s in manifest["shards"]} | {f"{VAL_NAME}/{s['name']}": s["tokens"] for s in val}


def finished_manifest(job: ChunkJob | CompactJob, out: Location) -> dict | None:
    """The manifest of an earlier run of exactly this job whose shards are all in place, else None."""
    try:
        manifest = json.loads(out.child(job.directory, MANIFEST).read_bytes())
        itemsize = DTYPES[job.settings.dtype].itemsize
        if manifest.get("fingerprint") != job.fingerprint():
            return None
        shards_in_place = all(out.child(name).size() == tokens * itemsize
                              for name, tokens in shard_files(manifest).items())
        if shards_in_place and (manifest["docs"] is None or out.child(manifest["docs"]).exists()):
            return manifest
    except (StorageError, ValueError, KeyError, TypeError):
        pass  # missing, or left half-way by a killed run: the job runs again
    return None


class ShardWriter:
    """Buffers at most one shard of tokens and writes each full shard as soon as it fills."""

    def __init__(self, out: Location, directory: str, shard_tokens: int, dtype: np.dtype):
        self.out, self.directory = out, directory
        self.buffer = np.empty(shard_tokens, dtype=dtype)
        self.filled = 0
        self.written = 0
        self.shards: list[dict] = []

    @property
    def position(self) -> int:
        """Tokens added so far."""
        return self.written + self.filled

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
        name = f"{self.directory}/shard-{len(self.shards):05d}.bin"
        self.out.child(name).write_bytes(data)
        self.shards.append({"name": name, "tokens": self.filled, "sha256": hashlib.sha256(data).hexdigest()})
        self.written += self.filled
        self.filled = 0


class _TokenStream:
    """A chunk's shards read front to back, one shard in memory at a time."""

    def __init__(self, out: Location, shards: list[dict], dtype: np.dtype):
        self._names = iter(s["name"] for s in shards)
        self._out, self._dtype = out, dtype
        self._current = np.empty(0, dtype=dtype)
        self._offset = 0
        self.position = 0

    def take(self, n: int) -> Iterator[np.ndarray]:
        while n > 0:
            if self._offset == len(self._current):
                self._current = np.frombuffer(self._out.child(next(self._names)).read_bytes(), dtype=self._dtype)
                self._offset = 0
            part = self._current[self._offset : self._offset + n]
            self._offset += len(part)
            self.position += len(part)
            n -= len(part)
            yield part

    def skip(self, n: int) -> None:
        for _ in self.take(n):
            pass
