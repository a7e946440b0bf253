"""Object IO on pyarrow's file systems (`timelake.ports.files.ObjectIO`): local paths, file:// and
s3:// URIs alike, and `SharedFileIO`, the FileIO the catalog reads tables through."""

from __future__ import annotations

import functools
import io
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from pyiceberg.io import InputFile, InputStream
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

from timelake.ports.files import S3_SCHEMES, local_path


class ArrowObjects:
    """`ObjectIO` on pyarrow's file systems; the runtime's ``objects``. Holds nothing itself: the file
    systems it makes are shared by the process (see `filesystem`)."""

    def filesystem(self, uri: str, io: Any = None) -> tuple[pafs.FileSystem, str]:
        return filesystem(uri, io)

    def make_parent(self, fs: pafs.FileSystem, path: str) -> None:
        make_parent(fs, path)


def filesystem(uri: str, io: Any = None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and path for a local path or a URI, spelled however an Iceberg writer
    spelled it: Java writes local files as ``file:/path`` (one slash), pyiceberg as ``file:///path``,
    Spark on S3 as ``s3a://``.

    ``io``: the table's FileIO (pyiceberg's PyArrow FileIO), whose file systems carry the catalog's
    properties (endpoint, region, credentials); without it, S3 is configured from the environment.
    An S3 file system is made once per bucket and credentials in a process and then reused: making
    one starts an AWS SDK client (about 10 ms) and, without an endpoint override, asks S3 for the
    bucket's region (one request), which a step that opens a file per unit would otherwise pay per file.
    Objects are uploaded with one PUT when they fit in one part (``allow_delayed_open``); otherwise
    every file, however small, takes three requests (create, upload part, complete)."""
    scheme, sep, rest = uri.partition(":")
    if not sep or len(scheme) == 1 or "/" in scheme:  # a plain path (or a Windows drive letter)
        return pafs.LocalFileSystem(), str(Path(uri).resolve())
    scheme = scheme.lower()
    if scheme == "file":
        return pafs.LocalFileSystem(), local_path(rest)
    if isinstance(io, PyArrowFileIO):
        _, netloc, path = PyArrowFileIO.parse_location(uri, io.properties)
        return io.fs_by_scheme(scheme, netloc), path
    if scheme in S3_SCHEMES:
        path = rest.removeprefix("//")
        env = os.environ
        return _s3(path.split("/", 1)[0], env.get("TIMELAKE_S3_ENDPOINT"), env.get("AWS_DEFAULT_REGION"),
                   env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SESSION_TOKEN")), path
    return pafs.FileSystem.from_uri(uri)


def make_parent(fs: pafs.FileSystem, path: str) -> None:
    """Create the folder a file will go into, on a local disk only. An object store has no folders:
    creating one there writes empty marker objects ("warehouse/", "warehouse/db/"...), which needs
    write access outside the prefix a step may write to."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)


@functools.lru_cache(maxsize=32)
def _s3(bucket: str, endpoint: str | None, region: str | None, key_id: str | None, token: str | None) -> pafs.S3FileSystem:
    """The S3 file system for ``bucket``; the credentials are in the key so that a process whose
    credentials change (a test assuming a role) never reuses a client made with the old ones."""
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        return pafs.S3FileSystem(endpoint_override=host, scheme=scheme, region=region or "us-east-1", allow_delayed_open=True)
    return pafs.S3FileSystem(region=pafs.resolve_s3_region(bucket), allow_delayed_open=True)


class SharedFileIO(PyArrowFileIO):
    """pyiceberg's PyArrow FileIO, made for a process that loads the same table again and again (a warm
    Lambda writes one unit per invocation, and loads the table for each).

    pyiceberg makes a new FileIO per table load, and each makes its own file system: on S3 a new AWS
    SDK client (about 10 ms) per load. Here the file systems are shared by every instance with the same
    properties and credentials. Table metadata files are immutable (a commit writes a new one), so the
    bytes of the last ones read are kept: loading a table whose metadata has not moved costs the
    catalog's pointer lookup only, not two more requests for a file already read."""

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties)
        key = (tuple(sorted(self.properties.items())), os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SESSION_TOKEN"))
        self.fs_by_scheme = functools.partial(_shared_fs, key, self.fs_by_scheme)

    def new_input(self, location: str) -> InputFile:  # type: ignore[override]  # pyiceberg reads through FileIO's contract, InputFile
        if not location.endswith(".metadata.json"):
            return super().new_input(location)
        with _LOCK:
            data = _METADATA.get(location)
            if data is not None:
                _METADATA.move_to_end(location)
        if data is None:
            with super().new_input(location).open() as stream:
                data = stream.read()
            with _LOCK:
                _METADATA[location] = data
                while len(_METADATA) > 1 and sum(map(len, _METADATA.values())) > METADATA_CACHE_BYTES:
                    _METADATA.popitem(last=False)
        return _BytesInput(location, data)


METADATA_CACHE_BYTES = 64 << 20  # table metadata kept per process; the newest file is kept whatever its size
_LOCK = threading.Lock()
_METADATA: OrderedDict[str, bytes] = OrderedDict()
_FILE_SYSTEMS: dict[tuple[Any, ...], pafs.FileSystem] = {}


def _shared_fs(key: tuple[Any, ...], make: Any, scheme: str, netloc: str | None = None) -> pafs.FileSystem:
    with _LOCK:
        found = _FILE_SYSTEMS.get((key, scheme, netloc))
    if found is None:
        found = make(scheme, netloc)
        with _LOCK:
            found = _FILE_SYSTEMS.setdefault((key, scheme, netloc), found)
    return found


class _BytesInput(InputFile):
    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._data)


def forget_shared_io() -> None:
    """Drops the shared file systems and the table metadata kept: after a fork (an AWS SDK client does
    not survive one), or when the FileIO's way of making file systems changed (a test that counts the
    files a read opens)."""
    with _LOCK:
        _forget()


def _forget() -> None:
    _s3.cache_clear()
    _FILE_SYSTEMS.clear()
    _METADATA.clear()


def _after_fork() -> None:
    """An AWS SDK client does not survive a fork; nor does a lock another thread held at the fork."""
    global _LOCK
    _LOCK = threading.Lock()
    _forget()


os.register_at_fork(after_in_child=_after_fork)
