"""Object IO: one pyarrow file system for local paths, file:// and s3:// URIs alike."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and path for a local path, file:// or s3:// URI."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).resolve())
    if uri.startswith("s3://") and os.environ.get("TIMELAKE_S3_ENDPOINT"):
        endpoint = os.environ["TIMELAKE_S3_ENDPOINT"]
        scheme, _, host = endpoint.partition("://")
        fs = pafs.S3FileSystem(endpoint_override=host, scheme=scheme, region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        return fs, uri.removeprefix("s3://")
    return pafs.FileSystem.from_uri(uri)


def make_parent(fs: pafs.FileSystem, path: str) -> None:
    """Create the folder a file will go into, on a local disk only. An object store has no folders:
    creating one there writes empty marker objects ("warehouse/", "warehouse/db/"...), which needs
    write access outside the prefix a step may write to."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
