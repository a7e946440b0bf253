"""The scan's spill: a partition's mapped rows laid out so that a work unit reads only its own rows.

A partition is cut into units by series bucket after the scan, so the scan cannot write a file per
unit. Instead every record batch of a spill file holds the rows of ONE series bucket, and an index
beside the file (``<file>.idx``) gives each batch run's byte offset and length, ordered by bucket
behind a directory of the buckets present. A unit reads the directory, its buckets' index rows and
their byte ranges only, adjacent ranges joined into one read (one GET on S3), so the bytes the write
step reads stay at the bytes spilled whatever the number of units per partition. Units take
contiguous bucket ranges (see ``plan._balance``), and within each scan batch the buckets are written in
order, so a unit's ranges are few and long.

Index layout, little-endian int64: ``[buckets present D, schema bytes]``, then D rows ``[bucket, first
run, runs]``, then one row ``[offset, length, rows]`` per run, grouped by bucket.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from timelake.ports.files import filesystem

INDEX_SUFFIX = ".idx"
MAX_READ = 32 << 20  # bytes of one read: touching runs are joined up to this, and a reader holds one read at a time
INDEX_HEAD = 16 << 10  # bytes of an index read first: its counts, its directory (at most 6,160 bytes) and the first runs
WHOLE = -1  # the bucket of a batch written without series buckets (a table without a series key)


@dataclass
class SpillFile:
    """One open spill file: an Arrow IPC stream plus the index of its batches."""

    uri: str
    schema: pa.Schema
    index: list[list[int]] = field(default_factory=list)  # [bucket, offset, length, rows] per batch run

    def __post_init__(self) -> None:
        self.fs, path = filesystem(self.uri)
        self.stream = self.fs.open_output_stream(path)
        self.writer = pa.ipc.new_stream(self.stream, self.schema)
        self.writer.write_batch(pa.RecordBatch.from_pylist([], schema=self.schema))  # puts the schema up front
        self.header = self.stream.tell()

    def write(self, rows: pa.Table, buckets: np.ndarray | None) -> None:
        """Appends ``rows``, one run of batches per bucket, in bucket order."""
        if buckets is None:
            self._append(WHOLE, rows)
            return
        order = np.argsort(buckets, kind="stable")
        ordered = buckets[order]
        rows = rows.take(pa.array(order))
        starts = np.concatenate(([0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1, [len(ordered)]))
        for lo, hi in zip(starts[:-1].tolist(), starts[1:].tolist()):
            self._append(int(ordered[lo]), rows.slice(lo, hi - lo))

    def _append(self, bucket: int, rows: pa.Table) -> None:
        start = self.stream.tell()
        for batch in rows.to_batches():
            self.writer.write_batch(batch)
        self.index.append([bucket, start, self.stream.tell() - start, rows.num_rows])

    def close(self) -> int:
        """Closes the file and writes its index; returns the bytes spilled (data and index)."""
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()
        runs = np.array(self.index, dtype=np.int64).reshape(-1, 4)
        runs = runs[np.argsort(runs[:, 0], kind="stable")]
        present, first, count = np.unique(runs[:, 0], return_index=True, return_counts=True)
        body = b"".join(part.astype("<i8").tobytes() for part in (
            np.array([len(present), self.header]), np.column_stack([present, first, count]), runs[:, 1:]))
        with self.fs.open_output_stream(filesystem(self.uri + INDEX_SUFFIX)[1]) as out:
            out.write(body)
        return size + len(body)


@dataclass
class SpillRead:
    """What a reader took from the spill, so the write step can report bytes read against bytes spilled."""

    bytes_read: int = 0
    reads: int = 0


def read(uris: list[str], buckets: list[int] | None, counter: SpillRead | None = None) -> Iterator[pa.RecordBatch]:
    """The batches of ``uris`` whose bucket is in ``buckets`` (all of them for None), reading only their bytes."""
    counter = counter if counter is not None else SpillRead()
    for uri in uris:
        fs, path = filesystem(uri)
        with fs.open_input_file(path + INDEX_SUFFIX) as index:
            ranges, schema_bytes = _ranges(_Index(index, counter), buckets)
        if not ranges:
            continue
        with fs.open_input_file(path) as handle:
            schema = pa.ipc.read_schema(pa.py_buffer(handle.read_at(schema_bytes, 0)))
            counter.bytes_read += schema_bytes
            for offset, length in ranges:
                body = handle.read_at(length, offset)
                counter.bytes_read += length
                counter.reads += 1
                messages = pa.ipc.MessageReader.open_stream(pa.BufferReader(body))
                while True:
                    try:
                        message = messages.read_next_message()
                    except StopIteration:
                        break
                    yield pa.ipc.read_record_batch(message, schema)


class _Index:
    """An index file whose first ``INDEX_HEAD`` bytes are read at once: the counts and the directory
    of buckets always, and all the runs of a small spill, so a unit of a small partition reads its
    index in one request instead of three."""

    def __init__(self, handle: Any, counter: SpillRead) -> None:
        self.handle, self.counter = handle, counter
        self.head = handle.read_at(min(handle.size(), INDEX_HEAD), 0)
        counter.bytes_read += len(self.head)

    def ints(self, offset: int, count: int) -> np.ndarray:
        if offset + 8 * count <= len(self.head):
            return np.frombuffer(self.head, dtype="<i8", count=count, offset=offset)
        self.counter.bytes_read += 8 * count
        return np.frombuffer(self.handle.read_at(8 * count, offset), dtype="<i8")


def _ranges(index: _Index, buckets: list[int] | None) -> tuple[list[tuple[int, int]], int]:
    """(offset, length) of the runs of ``buckets``, runs that touch joined up to MAX_READ; and the schema's bytes."""
    present_count, schema_bytes = index.ints(0, 2).tolist()
    directory = index.ints(16, 3 * present_count).reshape(-1, 3)
    if buckets is not None:
        directory = directory[np.isin(directory[:, 0], buckets)]
    runs_at = 16 + 24 * present_count
    rows = [index.ints(runs_at + 24 * first, 3 * count).reshape(-1, 3) for _, first, count in directory.tolist()]
    joined: list[list[int]] = []
    for offset, length, _ in sorted(r for block in rows for r in block.tolist()):
        if joined and joined[-1][0] + joined[-1][1] == offset and joined[-1][1] + length <= MAX_READ:
            joined[-1][1] += length
        else:
            joined.append([offset, length])
    return [(o, n) for o, n in joined], schema_bytes
