"""The scan's spill: a partition's mapped rows laid out so that a work unit reads only its own rows.

A partition is cut into units by series bucket after the scan, so the scan cannot write a file per
unit. Instead every record batch of a spill file holds the rows of ONE series bucket, and an index
beside the file (``<file>.idx``) gives each batch run's byte offset and length, ordered by bucket
behind a directory of the buckets present. A unit reads the index, then its buckets' byte ranges
only, adjacent ranges joined into one read (one GET on S3), so the bytes the write step reads stay at
the bytes spilled whatever the number of units per partition. Units take contiguous bucket ranges
(see ``plan._balance``), and within each scan batch the buckets are written in order, so a unit's
ranges are few and long.

Text series-key columns are stored as int32 codes into a dictionary per spill file, kept in the
index: a few thousand series, not millions of strings, so rows are reordered, written and read back
as fixed-width numbers, and a unit gets them dictionary-encoded, as its writer holds them anyway.

Index layout, little-endian int64: ``[lowest bucket L, bucket slots B, schema bytes, dictionary bytes]``,
then B rows ``[first run, runs]`` for buckets L .. L+B-1, then one row ``[offset, length, rows]`` per run,
grouped by bucket, then the dictionaries (an Arrow IPC stream of one row, a list of values per coded
column). A unit reads the header, the directory rows and the run rows of its buckets, and the dictionaries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timelake.ports.files import filesystem

INDEX_SUFFIX = ".idx"
MAX_READ = 32 << 20  # bytes of one read: touching runs are joined up to this, and a reader holds one read at a time
WRITE_BUFFER = 1 << 18  # the IPC writer writes each batch in many small pieces: buffer them into few writes
WHOLE = -1  # the bucket of a batch written without series buckets (a table without a series key)
HEADER = 4  # int64s before the directory


def coded_columns(schema: pa.Schema, series_key: tuple[str, ...]) -> tuple[str, ...]:
    """The series-key columns a spill stores as codes: the text ones."""
    return tuple(name for name in series_key if is_text(schema.field(name).type))


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)


class Dictionaries:
    """The values of a scan's coded columns, growing as batches bring new ones; a code never changes, so
    every spill file of the scan can keep the dictionaries as they are when it closes."""

    def __init__(self, schema: pa.Schema, series_key: tuple[str, ...]) -> None:
        self.schema = schema
        self.coded = coded_columns(schema, series_key)
        self.stored = pa.schema([f.with_type(pa.int32()) if f.name in self.coded else f for f in schema],
                                metadata=schema.metadata)
        self.values = {name: pa.array([], schema.field(name).type) for name in self.coded}
        self._serialized: tuple[tuple[int, ...] | None, bytes] = (None, b"")
        # a batch of no rows: every spill file starts with one, so that its schema is up front
        self.empty = pa.RecordBatch.from_arrays([pa.array([], f.type) for f in self.stored], schema=self.stored)

    def code(self, rows: pa.Table) -> pa.Table:
        """``rows`` with their coded columns as int32 codes (the stored schema)."""
        if not self.coded:
            return rows
        return pa.Table.from_arrays([self._code(f.name, rows.column(f.name)) if f.name in self.coded
                                     else rows.column(f.name) for f in self.schema], schema=self.stored)

    def _code(self, name: str, column: pa.ChunkedArray) -> pa.Array:
        """Looked up per distinct value of the batch, not per row."""
        encoded = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if not pa.types.is_dictionary(encoded.type):
            encoded = pc.dictionary_encode(encoded)
        batch_values = encoded.dictionary.cast(self.schema.field(name).type)
        known = self.values[name]
        where = pc.fill_null(pc.index_in(batch_values, value_set=known), -1).to_numpy(zero_copy_only=False).copy()
        new = where < 0
        if new.any():
            where[new] = len(known) + np.arange(int(new.sum()), dtype=where.dtype)
            self.values[name] = pa.concat_arrays([known, batch_values.filter(pa.array(new))])
        indices = encoded.indices
        codes = where.astype(np.int32)[indices.fill_null(0).to_numpy(zero_copy_only=False)]
        mask = indices.is_null().to_numpy(zero_copy_only=False) if indices.null_count else None
        return pa.array(codes, pa.int32(), mask=mask)

    def serialized(self) -> bytes:
        """One row, a list of values per coded column, as an Arrow IPC stream (made again only when
        values were added: the spill files of a task mostly close together, with the same values)."""
        if not self.coded:
            return b""
        size = tuple(len(values) for values in self.values.values())
        if self._serialized[0] != size:
            sink = pa.BufferOutputStream()
            table = pa.table({name: pa.array([values], pa.list_(values.type)) for name, values in self.values.items()})
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            self._serialized = (size, sink.getvalue().to_pybytes())
        return self._serialized[1]


@dataclass
class SpillFile:
    """One open spill file: an Arrow IPC stream plus the index of its batches. Rows come coded by
    ``dictionaries`` and are held until `flush` (the scan decides when, within its memory), so a
    file has few long runs per bucket rather than one per source batch."""

    uri: str
    dictionaries: Dictionaries
    index: list[list[int]] = field(default_factory=list)  # [bucket, offset, length, rows] per batch run
    held: list[tuple[pa.Table, np.ndarray | None]] = field(default_factory=list)
    held_bytes: int = 0

    def __post_init__(self) -> None:
        self.fs, path = filesystem(self.uri)
        self.stream = self.fs.open_output_stream(path, buffer_size=WRITE_BUFFER)
        self.writer = pa.ipc.new_stream(self.stream, self.dictionaries.stored)
        self.writer.write_batch(self.dictionaries.empty)  # puts the schema up front
        self.header = self.stream.tell()

    def write(self, pieces: list[tuple[pa.Table, np.ndarray | None]], nbytes: int) -> None:
        """Holds pieces of rows (coded) with their series buckets, ``nbytes`` in all, until the next flush."""
        self.held.extend(pieces)
        self.held_bytes += nbytes

    def flush(self) -> None:
        """Writes the rows held, one run per bucket, in bucket order (within a bucket in the order they came).
        Pieces of one bucket each (a source file per series) are moved whole; others are sorted by row."""
        held, self.held, self.held_bytes = self.held, [], 0
        held = [(rows, buckets) for rows, buckets in held if rows.num_rows]
        if not held:
            return
        if held[0][1] is None:
            for rows, _ in held:
                self._append(WHOLE, rows.to_batches())
            return
        if all(buckets[0] == buckets[-1] and (buckets == buckets[0]).all() for _, buckets in held):
            firsts = np.array([int(buckets[0]) for _, buckets in held])
            order = np.argsort(firsts, kind="stable")
            starts = np.concatenate(([0], np.flatnonzero(firsts[order][1:] != firsts[order][:-1]) + 1, [len(order)]))
            for lo, hi in zip(starts[:-1].tolist(), starts[1:].tolist()):
                pieces = [held[i][0] for i in order[lo:hi].tolist()]
                self._append(int(firsts[order[lo]]), [batch for rows in pieces for batch in rows.to_batches()])
            return
        rows = pa.concat_tables([r for r, _ in held]).combine_chunks()
        buckets = np.concatenate([b for _, b in held])
        narrow = buckets.astype(np.uint16) if 0 <= buckets.min() and buckets.max() < 1 << 16 else buckets
        order = np.argsort(narrow, kind="stable")  # 16-bit keys: a radix sort, linear in rows
        ordered = buckets[order]
        batch = rows.take(pa.array(order)).combine_chunks().to_batches()[0]  # one batch: runs are its slices
        starts = np.concatenate(([0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1, [len(ordered)]))
        for lo, hi in zip(starts[:-1].tolist(), starts[1:].tolist()):
            self._append(int(ordered[lo]), [batch.slice(lo, hi - lo)])

    def _append(self, bucket: int, batches: list[pa.RecordBatch]) -> None:
        start = self.stream.tell()
        for batch in batches:
            self.writer.write_batch(batch)
        self.index.append([bucket, start, self.stream.tell() - start, sum(b.num_rows for b in batches)])

    def close(self) -> int:
        """Writes what it holds, closes the file and writes its index; returns the bytes spilled (data and index)."""
        try:
            self.flush()
            self.writer.close()
            size = self.stream.tell()
            self.stream.close()
        except BaseException:
            self.discard()
            raise
        runs = np.array(self.index, dtype=np.int64).reshape(-1, 4)
        runs = runs[np.argsort(runs[:, 0], kind="stable")]
        lowest = int(runs[0, 0]) if len(runs) else 0
        slots = int(runs[-1, 0]) - lowest + 1 if len(runs) else 0
        counts = np.bincount(runs[:, 0] - lowest, minlength=slots)
        firsts = np.concatenate(([0], np.cumsum(counts)[:-1])) if slots else counts
        dictionaries = self.dictionaries.serialized()
        body = b"".join(part.astype("<i8").tobytes() for part in (
            np.array([lowest, slots, self.header, len(dictionaries)]), np.column_stack([firsts, counts]),
            runs[:, 1:])) + dictionaries
        with self.fs.open_output_stream(filesystem(self.uri + INDEX_SUFFIX)[1]) as out:
            out.write(body)
        return size + len(body)


    def discard(self) -> None:
        """Closes the file without writing what it holds, ignoring errors: its task failed (a full disk),
        and a resume spills it again. A buffered stream left open would try to flush when collected and
        print Arrow's error after the job's own."""
        self.held, self.held_bytes = [], 0
        for end in (self.writer.close, self.stream.close):
            try:
                end()
            except (OSError, pa.ArrowException):
                pass


@dataclass
class SpillRead:
    """What a reader took from the spill, so the write step can report bytes read against bytes spilled."""

    bytes_read: int = 0
    reads: int = 0


def read(uris: list[str], buckets: list[int] | None, counter: SpillRead | None = None) -> Iterator[pa.Table]:
    """The rows of ``uris`` whose bucket is in ``buckets`` (all of them for None), reading only their bytes,
    a table per read; coded columns come back dictionary-encoded."""
    counter = counter if counter is not None else SpillRead()
    for uri in uris:
        fs, path = filesystem(uri)
        with fs.open_input_file(path + INDEX_SUFFIX) as index:
            ranges, schema_bytes, dictionaries = _ranges(index, buckets, counter)
        if not ranges:
            continue
        with fs.open_input_file(path) as handle:
            schema = pa.ipc.read_schema(pa.py_buffer(handle.read_at(schema_bytes, 0)))
            counter.bytes_read += schema_bytes
            for offset, length in ranges:
                body = pa.py_buffer(handle.read_at(length, offset))
                counter.bytes_read += length
                counter.reads += 1
                messages = pa.ipc.MessageReader.open_stream(pa.BufferReader(body))
                batches = []
                while True:
                    try:
                        batches.append(pa.ipc.read_record_batch(messages.read_next_message(), schema))
                    except StopIteration:
                        break
                yield decoded(pa.Table.from_batches(batches, schema), dictionaries)


def decoded(rows: pa.Table, dictionaries: dict[str, pa.Array]) -> pa.Table:
    """Coded rows with their coded columns dictionary-encoded by ``dictionaries`` (the values by code)."""
    if not dictionaries:
        return rows
    columns, fields = [], []
    for f, column in zip(rows.schema, rows.columns):
        if f.name in dictionaries:
            values = dictionaries[f.name]
            column = pa.chunked_array([pa.DictionaryArray.from_arrays(column.combine_chunks(), values)])
            f = f.with_type(column.type)
        columns.append(column)
        fields.append(f)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=rows.schema.metadata))


def _ranges(index: Any, buckets: list[int] | None, counter: SpillRead) -> tuple[list[tuple[int, int]], int, dict[str, pa.Array]]:
    """(offset, length) of the runs of ``buckets``, runs that touch joined up to MAX_READ; the schema's
    bytes; the file's dictionaries (when any run is wanted). Reads the index's header, then only the
    directory rows and run rows of the wanted buckets (a unit's are contiguous), then the dictionaries."""
    lowest, slots, schema_bytes, dictionary_bytes = _ints(index, 0, HEADER, counter).tolist()
    if buckets is not None and not buckets:
        return [], schema_bytes, {}
    lo, hi = (lowest, lowest + slots - 1) if buckets is None else (max(min(buckets), lowest), min(max(buckets), lowest + slots - 1))
    if lo > hi:
        return [], schema_bytes, {}
    directory = _ints(index, 8 * (HEADER + 2 * (lo - lowest)), 2 * (hi - lo + 1), counter).reshape(-1, 2)
    wanted = directory[:, 1] > 0
    if buckets is not None:
        wanted &= np.isin(np.arange(lo, hi + 1), buckets)
    if not wanted.any():
        return [], schema_bytes, {}
    firsts, counts = directory[wanted, 0], directory[wanted, 1]
    start, end = int(firsts.min()), int((firsts + counts).max())
    runs = _ints(index, 8 * (HEADER + 2 * slots + 3 * start), 3 * (end - start), counter).reshape(-1, 3)
    chosen = runs[np.concatenate([np.arange(f - start, f - start + n) for f, n in zip(firsts.tolist(), counts.tolist())])]
    chosen = chosen[np.argsort(chosen[:, 0], kind="stable")]
    joined: list[list[int]] = []
    for offset, length in chosen[:, :2].tolist():
        if joined and joined[-1][0] + joined[-1][1] == offset and joined[-1][1] + length <= MAX_READ:
            joined[-1][1] += length
        else:
            joined.append([offset, length])
    dictionaries: dict[str, pa.Array] = {}
    if dictionary_bytes:
        raw = pa.py_buffer(index.read_at(dictionary_bytes, index.size() - dictionary_bytes))
        counter.bytes_read += dictionary_bytes
        table = pa.ipc.open_stream(raw).read_all()
        dictionaries = {name: table.column(name)[0].values for name in table.column_names}
    return [(o, n) for o, n in joined], schema_bytes, dictionaries


def _ints(handle: Any, offset: int, count: int, counter: SpillRead) -> np.ndarray:
    counter.bytes_read += 8 * count
    return np.frombuffer(handle.read_at(8 * count, offset), dtype="<i8").copy()
