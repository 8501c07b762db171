"""What ``prepare`` reads: input URLs expanded into files, files planned into chunks of about ``chunk_bytes``,
and each chunk's pieces read back as a stream of documents.

A chunk is a list of pieces: whole files, byte ranges of large uncompressed JSONL files (cut on line boundaries:
a line belongs to the range its first byte is in) or runs of Parquet row groups. A ``.json`` file is JSON Lines, or,
where it begins with ``[``, one JSON array of records (``datasets.load_dataset("json")`` reads both), read whole.
The plan depends only on the inputs and ``chunk_bytes``, never on the parallelism, so the same inputs always give
the same chunks.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.fs as pafs

from spotray.errors import DataError, StorageError
from spotray.storage import Location, StorageOptions, resolve

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_GLOB_CHARS = re.compile(r"[*?\[]")
READ_BLOCK = 16 << 20  # a default chunk's worth: one S3 GET for most JSONL ranges
TAIL_BLOCK = 256 << 10  # reads past a range's end, to finish its last line
IO_THREADS = 16  # concurrent small requests (stats, footers, manifests) from one process


@dataclass(frozen=True)
class InputFile:
    url: str
    size: int
    format: str
    compression: str | None


@dataclass(frozen=True)
class Piece:
    """Part of one input file: all of it, bytes ``[start, end)`` of a JSONL file, or some Parquet row groups."""

    url: str
    format: str
    compression: str | None
    size: int  # bytes of input this piece stands for (compressed, as stored)
    start: int = 0
    end: int | None = None
    row_groups: tuple[int, ...] = ()


@dataclass
class ReadStats:
    bytes_in: int = 0
    bad_lines: int = 0


def list_inputs(patterns: Sequence[str], fmt: str = "auto", options: StorageOptions | None = None) -> list[InputFile]:
    """Every file the patterns name, in the order given, each pattern's matches sorted; a file named twice counts once.

    A directory or an S3 prefix means every file under it, except names starting with ``.`` or ``_`` (markers such
    as ``_SUCCESS``); a glob (``*``, ``?``, ``[...]``, ``**`` for any depth) means the files it matches."""
    files: dict[str, InputFile] = {}
    for pattern in patterns:
        matches = _expand(pattern, options)
        if not matches:
            raise DataError(
                f"--input '{pattern}' matched no files: give a file, a directory, an s3:// prefix or a glob like "
                "'data/**/*.jsonl'"
            )
        for url, size in matches:
            files.setdefault(url, _input_file(url, size, fmt))
    return list(files.values())


def _expand(pattern: str, options: StorageOptions | None) -> list[tuple[str, int]]:
    if pattern.startswith("s3://"):
        return _expand_s3(pattern, options)
    path = os.path.expanduser(pattern.removeprefix("file://"))
    if os.path.isfile(path):
        return [(os.path.abspath(path), os.path.getsize(path))]
    if os.path.isdir(path):
        found = [p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True) if _listed(path, p)]
    else:
        found = glob.glob(path, recursive=True)
    return [(os.path.abspath(p), os.path.getsize(p)) for p in sorted(found) if os.path.isfile(p)]


def _expand_s3(pattern: str, options: StorageOptions | None) -> list[tuple[str, int]]:
    glob_at = _GLOB_CHARS.search(pattern)
    base = resolve(pattern[: glob_at.start()].rsplit("/", 1)[0] if glob_at else pattern, options)
    try:
        info = base.fs.get_file_info(base.path)
        if info.type == pafs.FileType.File and not glob_at:
            return [(base.url, info.size)]
        infos = base.fs.get_file_info(pafs.FileSelector(base.path, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise StorageError(
            f"--input '{pattern}': cannot list {base.url} ({exc}); check the bucket name, --endpoint-url and the "
            "credentials"
        ) from None
    if not infos and base.bucket_missing():
        raise StorageError(f"--input '{pattern}': bucket '{base.path.split('/')[0]}' does not exist; check the bucket "
                           "name and --endpoint-url")
    files = [(f"s3://{i.path}", i.size) for i in infos if i.type == pafs.FileType.File]
    if glob_at:
        matcher = _glob_regex(pattern)
        return sorted((url, size) for url, size in files if matcher.fullmatch(url))
    return sorted((url, size) for url, size in files if _listed(base.url, url))


def _listed(root: str, path: str) -> bool:
    """Under a directory or prefix, skip hidden files and markers (``.x``, ``_SUCCESS``) at any depth."""
    relative = path[len(root.rstrip("/")) + 1 :]
    return not any(part.startswith((".", "_")) for part in relative.split("/"))


def _glob_regex(pattern: str) -> re.Pattern:
    """``**/`` spans any number of directories, ``*`` and ``?`` stay within one, ``[...]`` is a character class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            close = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1 : close].replace("!", "^", 1) + "]")
            i = close + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def _stem(url: str) -> tuple[str, str | None]:
    """The file's lower-case name without its compression suffix, and the compression that suffix names."""
    name = posixpath.basename(url).lower()
    stem, ext = os.path.splitext(name)
    compression = COMPRESSIONS.get(ext)
    return (stem if compression else name), compression


def _input_file(url: str, size: int, fmt: str) -> InputFile:
    stem, compression = _stem(url)
    if fmt == "auto":
        fmt = "jsonl" if stem.endswith(_JSONL_SUFFIXES) else "parquet" if stem.endswith(_PARQUET_SUFFIXES) else "text"
    if fmt == "parquet" and compression:
        raise DataError(
            f"{url}: a Parquet file compresses its own pages; give the file without the outer {compression} "
            "compression"
        )
    return InputFile(url, size, fmt, compression)


def plan_chunks(files: Sequence[InputFile], chunk_bytes: int,
                options: StorageOptions | None = None) -> list[list[Piece]]:
    """Pieces of about ``chunk_bytes`` each, packed in input order into chunks of about ``chunk_bytes``."""
    with ThreadPoolExecutor(IO_THREADS) as pool:
        per_file = list(pool.map(lambda f: _pieces(f, chunk_bytes, options), files))
    chunks: list[list[Piece]] = []
    current, filled = [], 0
    for piece in (p for pieces in per_file for p in pieces):
        current.append(piece)
        filled += piece.size
        if filled >= chunk_bytes:
            chunks.append(current)
            current, filled = [], 0
    if current:
        chunks.append(current)
    return chunks


def _pieces(f: InputFile, chunk_bytes: int, options: StorageOptions | None) -> list[Piece]:
    if f.format == "jsonl" and _named(f, ".json") and _begins_an_array(f, options):
        f = replace(f, format="json")
    if f.format == "parquet":
        return _parquet_pieces(f, chunk_bytes, options)
    if f.format == "jsonl" and f.compression is None and f.size > chunk_bytes:
        return [Piece(f.url, f.format, None, min(chunk_bytes, f.size - s), s, min(s + chunk_bytes, f.size))
                for s in range(0, f.size, chunk_bytes)]
    return [Piece(f.url, f.format, f.compression, f.size)]


def _named(f: InputFile, suffix: str) -> bool:
    return _stem(f.url)[0].endswith(suffix)


def _begins_an_array(f: InputFile, options: StorageOptions | None) -> bool:
    loc = resolve(f.url, options)
    stream = pa.CompressedInputStream(loc.open_input(), f.compression) if f.compression else loc.open_input()
    try:
        with stream:
            head = stream.read(4096)
    except (pa.ArrowException, OSError):
        return False  # read as JSON Lines, whose reader names what is wrong
    return head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"[")


def _parquet_pieces(f: InputFile, chunk_bytes: int, options: StorageOptions | None) -> list[Piece]:
    meta = _parquet_file(resolve(f.url, options)).metadata
    sizes = [_compressed_size(meta.row_group(i)) for i in range(meta.num_row_groups)]
    pieces, group, filled = [], [], 0
    for i, size in enumerate(sizes):
        group.append(i)
        filled += size
        if filled >= chunk_bytes or i == len(sizes) - 1:
            pieces.append(Piece(f.url, f.format, None, filled, row_groups=tuple(group)))
            group, filled = [], 0
    return pieces


def _compressed_size(row_group) -> int:
    return sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns))


def _parquet_file(loc: Location):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(loc.open_input())
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, pa.ArrowInvalid) or "Parquet" in str(exc):
            raise DataError(f"{loc.url} is not a Parquet file ({exc}); fix the file or give --format") from None
        raise StorageError(f"cannot read {loc.url}: {exc}") from None


@dataclass
class DocumentReader:
    """Streams the documents (non-empty strings) of pieces; counts bytes read and bad lines skipped."""

    text_field: str = "text"
    skip_bad_lines: bool = False
    options: StorageOptions | None = None
    stats: ReadStats = field(default_factory=ReadStats)

    def documents(self, piece: Piece) -> Iterator[str]:
        """Every document's text, empty ones ("", a JSON null, a Parquet null, an empty file) as "" for the
        caller to count."""
        loc = resolve(piece.url, self.options)
        before = self.stats.bytes_in  # counted as it goes for progress, then set exactly
        if piece.format == "parquet":
            yield from self._parquet(loc, piece)
        elif piece.format == "jsonl":
            yield from self._jsonl(loc, piece)
        elif piece.format == "json":
            yield from self._json_array(loc, piece)
        else:
            yield self._read_whole(loc, piece).decode("utf-8", errors="replace")
        self.stats.bytes_in = before + piece.size

    def _read_whole(self, loc: Location, piece: Piece) -> bytes:
        if piece.compression is None:
            return loc.read_bytes()
        with self._compressed(loc, piece) as stream:
            return _read(stream, None, loc.url)

    def _compressed(self, loc: Location, piece: Piece):
        try:
            return pa.CompressedInputStream(loc.open_input(), piece.compression)
        except pa.ArrowException as exc:
            raise DataError(f"{loc.url}: cannot decompress as {piece.compression} ({exc})") from None

    def _jsonl(self, loc: Location, piece: Piece) -> Iterator[str]:
        for line, offset in self._lines(loc, piece):
            text = self._field(line, functools.partial(self._where_line, loc, piece, offset))
            if text is not None:
                yield text

    def _json_array(self, loc: Location, piece: Piece) -> Iterator[str]:
        try:
            records = json.loads(self._read_whole(loc, piece))
        except ValueError as exc:
            raise DataError(f"{loc.url} begins with '[' but is not valid JSON ({exc}): fix the file") from None
        if not isinstance(records, list):
            raise DataError(f"{loc.url} is a JSON {type(records).__name__}, not an array of records or JSON Lines: "
                            "fix the file")
        for number, record in enumerate(records, 1):
            text = self._text(record, functools.partial("{} item {} of its array".format, loc.url, number))
            if text is not None:
                yield text

    def _field(self, line: bytes, where: Callable[[], str]) -> str | None:
        """The line's text ("" for a null one); None for a blank line or a bad one skipped."""
        if not line.strip():
            return None
        try:
            record = json.loads(line)
        except ValueError:
            self._bad(where, "is not valid JSON")
            return None
        return self._text(record, where)

    def _text(self, record: object, where: Callable[[], str]) -> str | None:
        """The record's text ("" for a null one); None for a bad one skipped."""
        if not isinstance(record, dict):
            self._bad(where, f"is a JSON {type(record).__name__}, not an object")
            return None
        if self.text_field in record and record[self.text_field] is None:
            return ""
        text = record.get(self.text_field)
        if not isinstance(text, str):
            problem = "has no" if text is None else f"has a non-string ({type(text).__name__})"
            keys = ", ".join(sorted(record)[:10]) or "none"
            self._bad(where, f"{problem} field '{self.text_field}' (its fields: {keys})",
                      "pick the field with --text-field")
            return None
        return text

    def _bad(self, where: Callable[[], str], problem: str, fix: str = "") -> None:
        if self.skip_bad_lines:
            self.stats.bad_lines += 1
            return None
        fix = fix or "fix the file"
        raise DataError(f"{where()} {problem}: {fix}, or pass --skip-bad-lines to count and skip such lines")

    def _where_line(self, loc: Location, piece: Piece, offset: int) -> str:
        return f"{loc.url} line {self._line_number(loc, piece, offset)}"

    def _line_number(self, loc: Location, piece: Piece, offset: int) -> int:
        """1-based line number of the line at byte ``offset`` (decompressed) of the file; reads the file up to it."""
        stream = self._compressed(loc, piece) if piece.compression else loc.open_input()
        with stream:
            newlines, done = 0, 0
            while done < offset:
                block = stream.read(min(READ_BLOCK, offset - done))
                if not block:
                    break
                newlines += block.count(b"\n")
                done += len(block)
        return newlines + 1

    def _lines(self, loc: Location, piece: Piece) -> Iterator[tuple[bytes, int]]:
        """(line, byte offset of its start) for every line that starts in ``[start, end)``. A range is read with
        one request (on S3, one GET) plus short ones for the line that crosses its end."""
        if piece.compression:
            stream, position, end = self._compressed(loc, piece), 0, None
        else:
            # From the byte before ``start``: a line starts at ``start`` only if that byte is a newline.
            stream, position, end = loc.open_input(), max(piece.start - 1, 0), piece.end
            stream.seek(position)
        unaligned, read_to = piece.start > 0 and not piece.compression, position
        with stream:
            carry = b""
            while end is None or position < end:
                size = READ_BLOCK if end is None else min(max(end - read_to, TAIL_BLOCK), READ_BLOCK)
                block = _read(stream, size, loc.url)
                if not block:
                    break
                read_to += len(block)
                self.stats.bytes_in += len(block) if not piece.compression else 0
                lines = (carry + block).split(b"\n")
                carry = lines.pop()
                if unaligned and lines:
                    position += len(lines.pop(0)) + 1  # the end of a line that the previous range holds
                    unaligned = False
                for line in lines if not unaligned else ():
                    if end is not None and position >= end:
                        break
                    yield line, position
                    position += len(line) + 1
            if carry and not unaligned and (end is None or position < end):
                yield carry, position

    def _parquet(self, loc: Location, piece: Piece) -> Iterator[str]:
        parquet = _parquet_file(loc)
        if self.text_field not in parquet.schema_arrow.names:
            names = ", ".join(parquet.schema_arrow.names[:10])
            raise DataError(f"{loc.url} has no column '{self.text_field}' (its columns: {names}): pick one with "
                            "--text-field")
        column_type = parquet.schema_arrow.field(self.text_field).type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise DataError(f"{loc.url}: column '{self.text_field}' holds {column_type}, not text: pick a string "
                            "column with --text-field")
        for group in piece.row_groups:
            batches = parquet.iter_batches(batch_size=1024, row_groups=[group], columns=[self.text_field])
            for batch in _guarded(batches, f"row group {group} of {loc.url}"):
                for text in batch.column(0).to_pylist():
                    yield text or ""
            self.stats.bytes_in += _compressed_size(parquet.metadata.row_group(group))


def _guarded(items: Iterator, what: str) -> Iterator:
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable(what, exc) from None
        yield item


def _read(stream, size: int | None, url: str) -> bytes:
    try:
        return stream.read(size)
    except (pa.ArrowException, OSError) as exc:  # a truncated or corrupted .gz/.zst, or a storage error mid-read
        raise _unreadable(url, exc) from None


def _unreadable(what: str, exc: Exception) -> DataError:
    return DataError(f"cannot read {what} ({exc}): fix or replace the file")
