"""The one module that opens storage URLs: local paths, ``file://`` and ``s3://`` (AWS, MinIO, moto).

pyarrow's filesystems are used for both: they ship with Ray (which takes the same filesystem object for
its run storage), support ranged reads, and bring no ``botocore`` pin. boto3 does the one thing pyarrow's S3
filesystem cannot: a server-side copy of an object over 5 GB (multipart copy), for moving a directory.
"""

from __future__ import annotations

import functools
import io
import mmap
import os
import posixpath
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pyarrow.fs as pafs

from spotray.errors import NotFound, StorageError, Unreachable

UPLOAD_EVERY_S = 60.0  # how often a file kept locally for a run on S3 (its log, a tracker's files) is uploaded


ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # the standard AWS ones, most specific first


@dataclass(frozen=True)
class StorageOptions:
    """How to reach S3. ``None`` fields fall back to the standard AWS environment variables. ``endpoint_setting``
    is what a user sets ``endpoint_url`` by (a flag, a config key), for a message that says what to correct."""

    endpoint_url: str | None = None
    region: str | None = None
    endpoint_setting: str = field(default="--endpoint-url", compare=False)

    def resolved_endpoint(self) -> str | None:
        origin = self.endpoint_origin()
        return self.endpoint_url or (os.environ[origin] if origin else None)

    def endpoint_origin(self) -> str | None:
        """The setting the endpoint comes from; None for AWS S3 itself."""
        if self.endpoint_url:
            return self.endpoint_setting
        return next((name for name in ENDPOINT_VARIABLES if os.environ.get(name)), None)

    def resolved_region(self) -> str:
        return self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def ca_bundle() -> str | None:
    """The standard AWS setting for the CA that signed a private endpoint's certificate (an in-cluster MinIO's):
    boto3 reads it itself, pyarrow's S3 filesystem only when it is handed over."""
    path = os.environ.get("AWS_CA_BUNDLE") or None
    if path and not os.path.isfile(path):
        raise StorageError(f"AWS_CA_BUNDLE={path}: no such file; point it at the PEM file of the CA that signed the "
                           "S3 endpoint's certificate, or unset it")
    return path


@functools.cache
def _s3_filesystem(endpoint: str | None, region: str, ca_file: str | None) -> pafs.S3FileSystem:
    kwargs: dict = {"region": region, "tls_ca_file_path": ca_file}
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs.update(endpoint_override=parsed.netloc, scheme=parsed.scheme or "https")
    return pafs.S3FileSystem(**kwargs)


@functools.cache
def _s3_client(endpoint: str | None, region: str):
    import boto3  # only where a directory on S3 is moved
    from botocore.config import Config

    # Path-style addressing, as pyarrow's: an in-cluster MinIO has no per-bucket host names.
    return boto3.client("s3", endpoint_url=endpoint, region_name=region,
                        config=Config(s3={"addressing_style": "path"}) if endpoint else None)


@functools.cache
def _local_filesystem() -> pafs.LocalFileSystem:
    return pafs.LocalFileSystem()


@dataclass(frozen=True)
class Location:
    """A resolved storage URL: a pyarrow filesystem plus a path inside it."""

    url: str
    fs: pafs.FileSystem
    path: str
    options: StorageOptions | None = field(default=None, compare=False)  # how to reach S3, for boto3

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    @property
    def is_local(self) -> bool:
        """A local file system; any other (S3, the snapshot holders' memory) is an object store without
        directories, where an object appears whole when its stream is closed."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    def child(self, *parts: str) -> Location:
        joined = "/".join(p.strip("/") for p in parts if p)
        return Location(f"{self.url.rstrip('/')}/{joined}", self.fs, f"{self.path.rstrip('/')}/{joined}",
                        self.options)

    def parent(self) -> Location:
        return Location(self.url.rstrip("/").rsplit("/", 1)[0], self.fs, posixpath.dirname(self.path.rstrip("/")),
                        self.options)

    def file_named(self, name: str) -> Location:
        """This location, or its child ``name`` where this is a directory (``model_dir`` or ``model_dir/x.json``)."""
        return self.child(name) if self.is_dir() else self

    def exists(self) -> bool:
        return self._info().type != pafs.FileType.NotFound

    def reachable(self) -> bool:
        """Whether storage answers a look-up of this location now (whatever the answer)."""
        try:
            self._info()
        except StorageError:
            return False
        return True

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def size(self) -> int:
        info = self._info()
        if info.type != pafs.FileType.File:
            raise NotFound(f"{self.url}: not found")
        return info.size

    def stamp(self) -> str:
        """The object's size and modification time: what changes when it is replaced."""
        info = self._info()
        if info.type != pafs.FileType.File:
            raise NotFound(f"{self.url}: not found")
        return f"{info.size}|{info.mtime_ns}"

    def read_bytes(self) -> bytes:
        # A random-access file reads the whole object in one GET; pyarrow's S3 input stream reads it in small
        # ranged GETs, which made a 130 MB checkpoint take 50 s instead of 0.3 s from a loopback endpoint.
        with self._guard("read"):
            with self.fs.open_input_file(self.path) as f:
                return f.read()

    def read_view(self) -> memoryview:
        """The whole object as a writable buffer, without an up-front copy where possible: a private (copy-on-write)
        memory map of a local file, whose pages come from the page cache as they are touched; one GET on S3."""
        with self._guard("read"):
            if not self.is_local:
                with self.fs.open_input_file(self.path) as f:
                    buffer = bytearray(f.size())
                    if f.readinto(buffer) != len(buffer):
                        raise StorageError(f"{self.url}: the object ended early")
                    return memoryview(buffer)
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return memoryview(bytearray())
                return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_text_if_exists(self) -> str | None:
        """One GET where ``exists()`` and ``read_text()`` would make two requests; None where there is nothing."""
        data = self.read_bytes_if_exists()
        return data.decode("utf-8") if data is not None else None

    def read_bytes_if_exists(self) -> bytes | None:
        try:
            return self.read_bytes()
        except NotFound:
            return None

    def open_input(self) -> pafs.NativeFile:
        """A seekable file supporting ``read_at`` (ranged GETs on S3)."""
        with self._guard("open"):
            return self.fs.open_input_file(self.path)

    def open_output(self):
        """A write stream; on S3 the object appears only when the stream is closed, locally it is fsynced then."""
        with self._guard("write"):
            self._make_parent()
            if not self.is_local:
                return self.fs.open_output_stream(self.path)
            return _DurableFile(self.path)

    def write_bytes(self, data: bytes) -> None:
        """Write atomically: readers see the old object or the whole new one, never a part."""
        with self._guard("write"):
            self._make_parent()
            if not self.is_local:
                with self.fs.open_output_stream(self.path) as f:
                    f.write(data)
                return
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def put_file(self, local_path: str) -> None:
        """Copy a local file here, streaming (never whole in memory); readers never see a part of it."""
        with self._guard("write"):
            self._make_parent()
            if not self.is_local:
                pafs.copy_files(local_path, self.path, source_filesystem=_local_filesystem(),
                                destination_filesystem=self.fs)
                return
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, self.path)

    def list_names(self) -> list[str]:
        """Names directly under this location (files and directories); empty when it does not exist."""
        return sorted(posixpath.basename(i.path.rstrip("/")) for i in self._entries())

    def list_dir_names(self) -> list[str]:
        """Names of the directories directly under this location (one listing, no request per name)."""
        return sorted(posixpath.basename(i.path.rstrip("/")) for i in self._entries()
                      if i.type == pafs.FileType.Directory)

    def _entries(self) -> list[pafs.FileInfo]:
        with self._guard("list"):
            try:
                return self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
            except FileNotFoundError:  # pyarrow found it missing, then present: created while listed, so empty
                return []

    def delete_tree(self) -> None:
        with self._guard("delete"):
            if self.is_dir():
                self.fs.delete_dir(self.path)

    def move_tree_to(self, dest: Location, last: str) -> None:
        """Move this directory to ``dest`` on the same store. Locally one rename; on S3 each object is copied
        server-side, then deleted. ``last`` names the file that says the directory is whole: it is copied after
        the others and deleted before them, so that a move cut short leaves a whole directory on one side."""
        with self._guard("move"):
            if self.is_local:
                os.makedirs(posixpath.dirname(dest.path), exist_ok=True)
                os.rename(self.path, dest.path)
                return
            if not self.is_s3:  # a store whose own move is whole (the snapshot holders')
                self.fs.move(self.path, dest.path)
                return
            infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True))
            names = sorted((posixpath.relpath(i.path, self.path) for i in infos if i.type == pafs.FileType.File),
                           key=lambda name: name == last)
            if not names:
                raise FileNotFoundError(self.path)
            try:
                with ThreadPoolExecutor(max_workers=8) as pool:
                    list(pool.map(lambda name: self.child(name)._copy_object_to(dest.child(name)), names[:-1]))
                self.child(names[-1])._copy_object_to(dest.child(names[-1]))
            except Exception as exc:  # botocore's errors are not OSErrors
                raise StorageError(f"cannot move {self.url} to {dest.url}: {str(exc).splitlines()[0]}") from exc
            self.fs.delete_file(self.child(names[-1]).path)
            self.fs.delete_dir(self.path)

    def _copy_object_to(self, dest: Location) -> None:
        """A server-side copy of one S3 object (in parts where it is large)."""
        options = self.options or StorageOptions()
        bucket, key = self.path.split("/", 1)
        dest_bucket, dest_key = dest.path.split("/", 1)
        client = _s3_client(options.resolved_endpoint(), options.resolved_region())
        client.copy({"Bucket": bucket, "Key": key}, dest_bucket, dest_key)

    def bucket_missing(self) -> bool:
        """Whether this S3 URL's bucket does not exist (False for a local path)."""
        with self._guard("stat"):
            return self.is_s3 and self.fs.get_file_info(self.path.split("/")[0]).type == pafs.FileType.NotFound

    def check_writable(self) -> None:
        """Writes and removes one empty object here: a missing bucket, read-only credentials or a store that does not
        answer is one StorageError before anything is started or written."""
        folder = self.path
        while self.is_local and not os.path.isdir(folder) and folder != posixpath.dirname(folder):
            folder = posixpath.dirname(folder)  # the nearest that exists: no folder is left behind by a failure
        probe = posixpath.join(folder, f".write-check-{uuid.uuid4().hex[:8]}")
        with self._guard("write"):
            with self.fs.open_output_stream(probe):
                pass
            self.fs.delete_file(probe)

    def make_dirs(self) -> None:
        if self.is_local:  # object stores have no directories
            with self._guard("create"):
                self.fs.create_dir(self.path, recursive=True)

    def delete_file(self) -> None:
        with self._guard("delete"):
            if self.exists():
                self.fs.delete_file(self.path)

    def _make_parent(self) -> None:
        if self.is_local:
            self.fs.create_dir(posixpath.dirname(self.path), recursive=True)

    def _info(self) -> pafs.FileInfo:
        with self._guard("stat"):
            return self.fs.get_file_info(self.path)

    def _guard(self, action: str):
        return _StorageGuard(self.url, action, self.options)


class _DurableFile(io.FileIO):
    def __init__(self, path: str):
        super().__init__(path, "wb")

    def close(self) -> None:
        if not self.closed:
            os.fsync(self.fileno())
        super().close()


class _StorageGuard:
    """Turns low-level I/O errors into one readable StorageError naming the URL."""

    def __init__(self, url: str, action: str, options: StorageOptions | None = None):
        self.url, self.action, self.options = url, action, options

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or isinstance(exc, StorageError) or not isinstance(exc, OSError):
            return False
        if isinstance(exc, FileNotFoundError):
            raise NotFound(f"{self.url}: not found") from exc
        failed, options = f"cannot {self.action} {self.url}", self.options or StorageOptions()
        if "NETWORK_CONNECTION" in str(exc):  # pyarrow's S3 client: no answer
            why = str(exc).rpartition("Details: ")[2].strip()
            raise Unreachable(f"{failed}: the object store {_store_name(options)} does not answer ({why}): "
                              f"{_unreachable_fix(options)}") from exc
        if "NO_SUCH_BUCKET" in str(exc):
            raise StorageError(f"{failed}: the object store {_store_name(options)} has no bucket "
                               f"'{urlparse(self.url).netloc}': create it, or give a URL in a bucket that exists"
                               ) from exc
        raise StorageError(f"{failed}: {exc}") from exc


def _store_name(options: StorageOptions) -> str:
    endpoint = options.resolved_endpoint()
    return f"at {endpoint}" if endpoint else "(AWS S3)"


def _unreachable_fix(options: StorageOptions) -> str:
    origin = options.endpoint_origin()
    if origin:
        return f"correct {origin}, or start the store"
    return (f"give the store's endpoint ({options.endpoint_setting}, or AWS_ENDPOINT_URL) if it is not AWS S3, or "
            "check this machine's network")


def resolve(url: str, options: StorageOptions | None = None) -> Location:
    """Resolve a local path, ``file://`` URL or ``s3://bucket/prefix`` into a Location."""
    if not url:
        raise StorageError("empty storage URL: give a local path, file:///abs/path or s3://bucket/prefix")
    options = options or StorageOptions()
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{url}: an S3 URL needs a bucket, e.g. s3://my-bucket/prefix")
        fs = _s3_filesystem(options.resolved_endpoint(), options.resolved_region(), ca_bundle())
        path = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        return Location(f"s3://{path}", fs, path, options)
    if parsed.scheme == "file":
        local = parsed.path
    elif parsed.scheme == "":
        local = url
    else:
        raise StorageError(f"{url}: unsupported URL scheme '{parsed.scheme}'; use a local path, file:// or s3://")
    local = os.path.abspath(os.path.expanduser(local))
    return Location(local, _local_filesystem(), local)
