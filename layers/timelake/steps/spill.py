"""The scan's spill: a partition's mapped rows laid out so that a work unit reads only its own rows.

A partition is cut into units by series bucket after the scan, so the scan cannot write a file per
unit. Instead the rows of a flush are written in bucket order, and an index beside the file
(``<file>.idx``) gives each bucket run's bytes (the record batches that hold it) and rows within them,
ordered by bucket behind a directory of the buckets present. A unit reads the index, then its buckets'
byte ranges only, adjacent ranges joined into one read (one GET on S3). Units take contiguous bucket
ranges (see ``plan._balance``), and within each flush the buckets are written in order, so a unit's
ranges are few and long.

A record batch costs its writer and its reader tens of microseconds whatever its rows, so runs of
consecutive buckets smaller than ``join_bytes`` share one batch: a flush of a file per device over a
month is otherwise thousands of batches of a few thousand rows. A unit then reads the runs of its
neighbours' buckets that share a batch with its own, at most ``join_bytes`` at each end of its bucket
range per flush; the scan sets ``join_bytes`` to a small fraction of the table's target file size (a
partition has several units only when its rows exceed that size), so the bytes the write step reads
stay close to the bytes spilled whatever the number of units per partition.

Text series-key columns are stored as int32 codes into a dictionary per scan task, kept in the
index: a few thousand series, not millions of strings, so rows are reordered, written and read back
as fixed-width numbers, and a unit gets them dictionary-encoded, as its writer holds them anyway.

A scan task spills every partition it does not write itself to ONE file; each flush writes the runs
of every partition held, a partition's together, and the index keeps each partition's runs apart.

Index layout, little-endian int64: ``[partitions P, schema bytes, dictionary bytes, FORMAT]``, then P rows
``[spec id, value, lowest bucket L, bucket slots B, section]`` ordered by (spec id, value), where section
is the int64 at which the partition's B rows ``[first run, runs]`` for buckets L .. L+B-1 start, followed
by one row ``[offset, length, first row, rows]`` per run (the bytes of the batches holding it, and its
rows counted from the first of them), grouped by bucket; after the sections the dictionaries (an Arrow
IPC stream of one row, a list of values per coded column). A unit reads the header and partition rows,
the directory rows and the run rows of its buckets, and the dictionaries.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timelake.errors import BackfillError
from timelake.model.layout import RUN_ROWS, by_index, concat_ranges, gather, run_starts, single_array, stable_argsort
from timelake.ports.files import ObjectIO

INDEX_SUFFIX = ".idx"
MAX_READ = 32 << 20  # bytes of one read: touching runs are joined up to this, and a reader holds one read at a time
WRITE_BUFFER = 1 << 18  # the IPC writer writes each batch in many small pieces: buffer them into few writes
JOIN_BYTES = 1 << 20  # at most this many bytes of runs share one record batch (see the module docstring)
JOIN_SHARE = 64  # ... and at most this share of the table's target file size
WHOLE = -1  # the bucket of a batch written without series buckets (a table without a series key)
HEADER = 4  # int64s of the index's header
FORMAT = int.from_bytes(b"tlspill2", "little")  # the header's last int64: this layout (the first had dictionary bytes there)
PARTITION = 5  # int64s of a partition's row in the index
RUN = 4  # int64s of a run's row in the index
CACHED_DICTIONARIES = 64  # spill files whose parsed dictionaries a process keeps (a job has about 4 per core)
CACHED_DICTIONARY_BYTES = 64 << 10  # ... when their bytes are at most this (a few thousand series)


def join_bytes(target_file_size: int) -> int:
    """Bytes of runs that may share a record batch in a table of this target file size: a unit of a
    partition cut into several holds about a target file's rows, which take more bytes spilled (numbers,
    uncompressed) than in Parquet, so a unit reads at most 2 / JOIN_SHARE more than its own per flush."""
    return min(JOIN_BYTES, target_file_size // JOIN_SHARE)


def coded_columns(schema: pa.Schema, series_key: tuple[str, ...]) -> tuple[str, ...]:
    """The series-key columns a spill stores as codes: the text ones."""
    return tuple(name for name in series_key if is_text(schema.field(name).type))


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)


class Dictionaries:
    """The values of a scan's coded columns, growing as batches bring new ones; a code never changes, so
    the task's spill file keeps the dictionaries as they are when it closes."""

    def __init__(self, schema: pa.Schema, series_key: tuple[str, ...]) -> None:
        self.schema = schema
        self.coded = coded_columns(schema, series_key)
        self.stored = pa.schema([f.with_type(pa.int32()) if f.name in self.coded else f for f in schema],
                                metadata=schema.metadata)
        self.values = {name: pa.array([], schema.field(name).type) for name in self.coded}
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
        encoded = single_array(column)
        if not pa.types.is_dictionary(encoded.type):
            encoded = pc.dictionary_encode(encoded)
        batch_values = encoded.dictionary.cast(self.schema.field(name).type)
        known = self.values[name]
        where = pc.fill_null(pc.index_in(batch_values, value_set=known), -1).to_numpy(zero_copy_only=False).copy()
        new = where < 0
        if new.any():
            where[new] = len(known) + np.arange(int(new.sum()), dtype=where.dtype)
            self.values[name] = pa.concat_arrays([known, batch_values.filter(pa.array(new))])
        return by_index(where.astype(np.int32, copy=False), encoded)

    def serialized(self) -> bytes:
        """One row, a list of values per coded column, as an Arrow IPC stream."""
        if not self.coded:
            return b""
        sink = pa.BufferOutputStream()
        table = pa.table({name: pa.array([values], pa.list_(values.type)) for name, values in self.values.items()})
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()


@dataclass
class _Held:
    """One partition's part of a spill file: its runs written so far."""

    index: list[np.ndarray] = field(default_factory=list)  # [bucket, offset, length, first row, rows] per run, a block per batch
    written: int = 0  # bytes of the batches written


@dataclass
class _Batch:
    """A batch of rows held until the next flush, cut into runs of one partition and bucket: run i is
    ``rows[starts[i]:starts[i + 1]]``, of the file's partition ``ids[i]`` and bucket ``buckets[i]``."""

    rows: pa.RecordBatch
    ids: np.ndarray
    buckets: np.ndarray
    starts: np.ndarray


class SpillFile:
    """One scan task's spill file: an Arrow IPC stream that every partition the task spills shares, and
    one index of the runs of each. Batches of rows come coded by ``dictionaries`` and are held whole
    until a `flush` (the scan decides when, within its memory), which writes every partition's rows held,
    so a partition has few long runs per bucket rather than one per source batch. One file a task, not
    one a partition: a file per device over a month touches every day in every task, and each file
    created costs a request on S3 (and about a millisecond on some local disks).

    A flush orders runs, not rows: a batch's rows of one partition and bucket lie together once it is
    held (a file per device has them so; other batches are ordered by partition and bucket as they
    come), and a flush sorts the runs of all batches held and copies each once, into the record batch
    that writes it. Its work is per run and per record batch written, not per partition and piece."""

    def __init__(self, uri: str, dictionaries: Dictionaries, join_bytes: int = 0, *, objects: ObjectIO) -> None:
        """``join_bytes``: runs smaller than this share a record batch; 0: a batch (or more) per run."""
        self.uri = uri
        self.objects = objects
        self.dictionaries = dictionaries
        self.join_bytes = join_bytes
        self.partitions: dict[tuple[int, int], _Held] = {}
        self.keys: list[tuple[int, int]] = []  # the file's partitions, by the id its runs carry
        self.ids: dict[tuple[int, int], int] = {}
        self.held: list[_Batch] = []
        self.held_bytes = 0  # of the batches held, as the scan counts them
        self.fs, path = objects.filesystem(uri)
        self.stream = self.fs.open_output_stream(path, buffer_size=WRITE_BUFFER)
        self.writer = pa.ipc.new_stream(self.stream, dictionaries.stored)
        self.writer.write_batch(dictionaries.empty)  # puts the schema up front
        self.header = self.stream.tell()

    def hold(self, rows: pa.Table, partitions: list[tuple[int, int] | None], codes: np.ndarray,
             buckets: np.ndarray | None, nbytes: int, runs: np.ndarray | None = None) -> None:
        """Holds ``rows`` (coded), ``nbytes`` in all, until the next flush: row i is of partition
        ``partitions[codes[i]]`` (spec id, value; None for a code no row has) and series bucket
        ``buckets[i]`` (None: the table has no series key). With ``runs``, where runs of rows start,
        ``codes`` and ``buckets`` are the runs'."""
        if not rows.num_rows:
            return
        ids = np.array([-1 if key is None else self._id(key) for key in partitions], dtype=np.int64)[codes]
        starts = run_starts(ids, buckets)  # given runs: where the next runs of one partition and bucket are one
        if runs is None and len(starts) > max(1, len(ids) // RUN_ROWS):  # runs of a few rows: order the rows, one copy now
            order = _stable_order(ids, buckets)
            rows, ids = gather(rows, order), ids[order]
            buckets = buckets[order] if buckets is not None else None
            starts = run_starts(ids, buckets)
        # one record batch: a run is then a batch's slice, which costs half a table's (a flush takes one a run)
        self.held.append(_Batch(rows.combine_chunks().to_batches()[0], ids[starts],
                                np.full(len(starts), WHOLE) if buckets is None else buckets[starts],
                                np.append(starts if runs is None else runs[starts], rows.num_rows)))
        self.held_bytes += nbytes

    def _id(self, key: tuple[int, int]) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.keys)
            self.keys.append(key)
            self.partitions[key] = _Held()
        return self.ids[key]

    def flush(self) -> None:
        """Writes the rows held: each partition's runs together, in bucket order (a bucket's in the order
        they came); consecutive runs that fit in ``join_bytes`` together as one record batch, a larger
        run as its own."""
        held, self.held = self.held, []
        nbytes, self.held_bytes = self.held_bytes, 0
        if not held:
            return
        row_bytes = nbytes / sum(batch.rows.num_rows for batch in held)
        runs = _Runs(held)
        order = np.lexsort((runs.buckets, runs.ids)).tolist()  # a stable sort: a bucket's runs stay in order
        ids, sizes = runs.ids.tolist(), (runs.sizes * row_bytes).tolist()
        joined: list[int] = []
        written: list[int] = []  # the runs in the order written
        batches: list[tuple[int, int, int]] = []  # per record batch: how many runs, its offset and its length
        size = 0.0
        for run in order:
            if joined and (size + sizes[run] > self.join_bytes or ids[run] != ids[joined[0]]):
                batches.append(self._write_batch(runs, joined))
                written += joined
                joined, size = [], 0.0
            if sizes[run] >= self.join_bytes:
                batches.append(self._write_batch(runs, [run]))
                written.append(run)
                continue
            joined.append(run)
            size += sizes[run]
        if joined:
            batches.append(self._write_batch(runs, joined))
            written += joined
        self._index(runs, np.array(written, dtype=np.int64), np.array(batches, dtype=np.int64).reshape(-1, 3))

    def _write_batch(self, runs: _Runs, chosen: list[int]) -> tuple[int, int, int]:
        """The ``chosen`` runs (of one partition, in order) as one record batch, copied once; a single run
        as it is. Returns (how many runs, offset, length): the flush indexes all its batches at once (`_index`)."""
        start = self.stream.tell()
        self.writer.write_batch(runs.slice(chosen[0]) if len(chosen) == 1 else pa.concat_batches([runs.slice(run) for run in chosen]))
        return len(chosen), start, self.stream.tell() - start

    def _index(self, runs: _Runs, written: np.ndarray, batches: np.ndarray) -> None:
        """Index rows for a flush's record batches: per batch, its runs of one bucket that follow one another
        as one row [bucket, offset, length, first row in the batch, rows]. Computed for the whole flush in
        a few array passes, not per batch: a flush of a file per device writes thousands of batches."""
        count, offset, length = batches.T
        batch = np.repeat(np.arange(len(batches)), count)  # each written run's batch
        first_run = np.cumsum(count) - count  # each batch's first, among the written runs
        buckets, sizes, ids = runs.buckets[written], runs.sizes[written], runs.ids[written]
        before = np.cumsum(sizes) - sizes  # rows of the flush written before each run
        within = before - before[first_run[batch]]  # ... and before it in its batch
        firsts = run_starts(batch, buckets)
        at = batch[firsts]
        rows = np.column_stack([buckets[firsts], offset[at], length[at], within[firsts], np.add.reduceat(sizes, firsts)])
        # a partition's runs are written together (the flush orders them by partition): a block each
        first_id = ids[firsts]
        edges = run_starts(first_id)
        bytes_of = np.bincount(ids[first_run], weights=length, minlength=len(self.keys))
        for lo, hi in zip(edges.tolist(), [*edges[1:].tolist(), len(firsts)], strict=True):
            part = self.partitions[self.keys[int(first_id[lo])]]
            part.index.append(rows[lo:hi])
            part.written += int(bytes_of[int(first_id[lo])])

    def close(self) -> dict[tuple[int, int], int]:
        """Writes what it holds, closes the file and writes its index; returns the bytes spilled per
        partition (its batches and index rows, and the schema and dictionaries each of its reads takes)."""
        try:
            self.flush()
            self.writer.close()
            self.stream.close()
        except BaseException:
            self.discard()
            raise
        dictionaries = self.dictionaries.serialized()
        keys = sorted(self.partitions)
        table, sections, spilled = [], [], {}
        at = HEADER + PARTITION * len(keys)  # int64s before the first partition's section
        for key in keys:
            part = self.partitions[key]
            runs = np.concatenate(part.index).astype(np.int64) if part.index else np.empty((0, 5), dtype=np.int64)
            runs = runs[np.argsort(runs[:, 0], kind="stable")]
            lowest = int(runs[0, 0]) if len(runs) else 0
            slots = int(runs[-1, 0]) - lowest + 1 if len(runs) else 0
            counts = np.bincount(runs[:, 0] - lowest, minlength=slots)
            firsts = np.concatenate(([0], np.cumsum(counts)[:-1])) if slots else counts
            table.append([key[0], key[1], lowest, slots, at])
            sections += [np.column_stack([firsts, counts]).reshape(-1), runs[:, 1:].reshape(-1)]
            size = 2 * slots + RUN * len(runs)
            at += size
            spilled[key] = part.written + 8 * (size + PARTITION + HEADER) + self.header + len(dictionaries)
        body = b"".join(np.asarray(part, dtype="<i8").tobytes() for part in (
            [len(keys), self.header, len(dictionaries), FORMAT], np.array(table, dtype=np.int64).reshape(-1), *sections)) + dictionaries
        with self.fs.open_output_stream(self.objects.filesystem(self.uri + INDEX_SUFFIX)[1]) as out:
            out.write(body)
        return spilled

    def discard(self) -> None:
        """Closes the file without writing what it holds, ignoring errors: its task failed (a full disk),
        and a resume spills it again. A buffered stream left open would try to flush when collected and
        print Arrow's error after the job's own."""
        self.held.clear()
        for end in (self.writer.close, self.stream.close):
            with contextlib.suppress(OSError, pa.ArrowException):
                end()


class _Runs:
    """The runs of the batches held, as arrays: run i is rows ``starts[i]`` .. ``starts[i] + sizes[i]`` of
    held batch ``batches[i]``."""

    def __init__(self, held: list[_Batch]) -> None:
        self.ids = np.concatenate([batch.ids for batch in held])
        self.buckets = np.concatenate([batch.buckets for batch in held])
        self.sizes = np.concatenate([np.diff(batch.starts) for batch in held])
        self._where = [(batch.rows, start, size) for batch in held
                       for start, size in zip(batch.starts[:-1].tolist(), np.diff(batch.starts).tolist(), strict=True)]

    def slice(self, run: int) -> pa.RecordBatch:
        rows, start, size = self._where[run]
        return rows.slice(start, size)


def _stable_order(ids: np.ndarray, buckets: np.ndarray | None) -> np.ndarray:
    """The stable order of rows by (partition, bucket): a stable sort by bucket, then by partition."""
    if buckets is None:
        return stable_argsort(ids)
    order = stable_argsort(buckets)
    return order[stable_argsort(ids[order])]


@dataclass
class SpillRead:
    """What a reader took from the spill, so the write step can report bytes read against bytes spilled."""

    bytes_read: int = 0
    reads: int = 0


def read(uris: list[str], partition: tuple[int, int], buckets: list[int] | None,
         counter: SpillRead | None = None, *, objects: ObjectIO) -> Iterator[pa.Table]:
    """The rows of ``partition`` (spec id, value) in ``uris`` whose bucket is in ``buckets`` (all of them for
    None), reading only the bytes of the batches that hold them, a table per read; coded columns come back
    dictionary-encoded."""
    for rows, dictionaries in read_coded(uris, partition, buckets, counter, objects=objects):
        yield decoded(rows, dictionaries)


def read_coded(uris: list[str], partition: tuple[int, int], buckets: list[int] | None,
               counter: SpillRead | None = None, *, objects: ObjectIO) -> Iterator[tuple[pa.Table, dict[str, pa.Array]]]:
    """`read`, its coded columns left as codes beside their file's dictionaries (one dict object for all the
    reads of a file): a reader that joins many reads decodes each file's once, not each read."""
    counter = counter if counter is not None else SpillRead()
    for uri in uris:
        fs, path = objects.filesystem(uri)
        with fs.open_input_file(path + INDEX_SUFFIX) as index:
            reads, schema_bytes, dictionaries = _ranges(index, partition, buckets, counter, uri)
        if not reads:
            continue
        with fs.open_input_file(path) as handle:
            schema = pa.ipc.read_schema(pa.py_buffer(handle.read_at(schema_bytes, 0)))
            counter.bytes_read += schema_bytes
            for offset, length, parts in reads:
                body = pa.py_buffer(handle.read_at(length, offset))
                counter.bytes_read += length
                counter.reads += 1
                tables = []
                for at, size, slices in parts:
                    held = _batches(body.slice(at - offset, size), schema)
                    tables += [held.slice(first, rows) for first, rows in slices]
                yield (tables[0] if len(tables) == 1 else pa.concat_tables(tables)), dictionaries


def _batches(body: pa.Buffer, schema: pa.Schema) -> pa.Table:
    """The record batches of ``body`` (whole IPC messages), as one table over its buffers."""
    messages = pa.ipc.MessageReader.open_stream(pa.BufferReader(body))
    batches = []
    while True:
        try:
            batches.append(pa.ipc.read_record_batch(messages.read_next_message(), schema))
        except StopIteration:
            return pa.Table.from_batches(batches, schema)


def decoded(rows: pa.Table, dictionaries: dict[str, pa.Array]) -> pa.Table:
    """Coded rows with their coded columns dictionary-encoded by ``dictionaries`` (the values by code)."""
    if not dictionaries:
        return rows
    columns, fields = [], []
    for f, column in zip(rows.schema, rows.columns, strict=True):
        if f.name in dictionaries:  # chunk by chunk: a read's slices are not copied together first
            values = dictionaries[f.name]
            kind = pa.dictionary(f.type, values.type)
            column = pa.chunked_array([pa.DictionaryArray.from_arrays(chunk, values) for chunk in column.chunks], kind)
            f = f.with_type(kind)
        columns.append(column)
        fields.append(f)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=rows.schema.metadata))


Read = tuple[int, int, list[tuple[int, int, list[tuple[int, int]]]]]


def _ranges(index: Any, partition: tuple[int, int], buckets: list[int] | None,
            counter: SpillRead, uri: str) -> tuple[list[Read], int, dict[str, pa.Array]]:
    """The reads that fetch the runs of ``buckets`` of ``partition``: (offset, length, parts), touching
    batches joined up to MAX_READ, each part (offset, length, row slices) the batches that hold some of the
    runs and the runs' (first row, rows) among their rows, runs that follow one another joined into one
    slice; the schema's bytes; the file's dictionaries (when any run is wanted). Reads the index's header
    and partition rows, then only the directory rows and run rows of the wanted buckets (a unit's are
    contiguous), then the dictionaries."""
    partitions, schema_bytes, dictionary_bytes, layout = _ints(index, 0, HEADER, counter).tolist()
    if layout != FORMAT:
        raise BackfillError(f"{uri} was spilled by an earlier version of timelake, in another layout, and this "
                            "version cannot read it: abort the job and submit it again")
    table = _ints(index, 8 * HEADER, PARTITION * partitions, counter).reshape(-1, PARTITION)
    found = np.flatnonzero((table[:, 0] == partition[0]) & (table[:, 1] == partition[1]))
    if (buckets is not None and not buckets) or not len(found):
        return [], schema_bytes, {}
    lowest, slots, section = table[found[0], 2:].tolist()
    lo, hi = (lowest, lowest + slots - 1) if buckets is None else (max(min(buckets), lowest), min(max(buckets), lowest + slots - 1))
    if lo > hi:
        return [], schema_bytes, {}
    directory = _ints(index, 8 * (section + 2 * (lo - lowest)), 2 * (hi - lo + 1), counter).reshape(-1, 2)
    wanted = directory[:, 1] > 0
    if buckets is not None:
        wanted &= np.isin(np.arange(lo, hi + 1), buckets)
    if not wanted.any():
        return [], schema_bytes, {}
    firsts, counts = directory[wanted, 0], directory[wanted, 1]
    start, end = int(firsts.min()), int((firsts + counts).max())
    runs = _ints(index, 8 * (section + 2 * slots + RUN * start), RUN * (end - start), counter).reshape(-1, RUN)
    chosen = runs[concat_ranges(firsts - start, counts)]
    offsets, lengths, rows_at, rows = chosen[np.lexsort((chosen[:, 2], chosen[:, 0]))].T
    # a part per batch (offset); within it, runs that follow one another as one slice
    new_part = np.ones(len(offsets), dtype=bool)
    new_part[1:] = offsets[1:] != offsets[:-1]
    new_slice = new_part.copy()
    new_slice[1:] |= rows_at[1:] != rows_at[:-1] + rows[:-1]
    at = np.flatnonzero(new_slice)
    parts: list[tuple[int, int, list[tuple[int, int]]]] = []  # (offset, length, [(first row, rows), ...])
    for first_of_part, offset, length, first, count in zip(new_part[at].tolist(), offsets[at].tolist(), lengths[at].tolist(),
                                                            rows_at[at].tolist(), np.add.reduceat(rows, at).tolist(), strict=True):
        if first_of_part:
            parts.append((offset, length, []))
        parts[-1][2].append((first, count))
    reads: list[list[Any]] = []
    for part in parts:
        offset, length, _ = part
        if reads and reads[-1][0] + reads[-1][1] == offset and reads[-1][1] + length <= MAX_READ:
            reads[-1][1] += length
            reads[-1][2].append(part)
        else:
            reads.append([offset, length, [part]])
    dictionaries: dict[str, pa.Array] = {}
    if dictionary_bytes:
        raw = index.read_at(dictionary_bytes, index.size() - dictionary_bytes)
        dictionaries = (_parsed if len(raw) <= CACHED_DICTIONARY_BYTES else _parse)(raw)
        counter.bytes_read += dictionary_bytes
    return [(o, n, p) for o, n, p in reads], schema_bytes, dictionaries


def _parse(raw: bytes) -> dict[str, pa.Array]:
    """A spill file's dictionaries from their bytes (`Dictionaries.serialized`)."""
    table = pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
    return {name: table.column(name)[0].values for name in table.column_names}


# `_parse`, kept per process: every unit a process writes reads its partition's files, whose dictionaries are
# the same, and parsing them was 40 % of finding a unit's reads in a file. Keyed by the bytes themselves, so a
# file spilled again with other series is never decoded by the old ones; only small ones are kept
# (`CACHED_DICTIONARY_BYTES`), so the cache holds a few MB whatever the number of series. Callers share the
# dict it returns and must not change it.
_parsed = functools.lru_cache(maxsize=CACHED_DICTIONARIES)(_parse)


def _ints(handle: Any, offset: int, count: int, counter: SpillRead) -> np.ndarray:
    counter.bytes_read += 8 * count
    return np.frombuffer(handle.read_at(8 * count, offset), dtype="<i8").copy()
