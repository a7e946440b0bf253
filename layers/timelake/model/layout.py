"""How rows map onto the table's final layout: partition (tier spec + transform value) and series slice.

Plan, write and validate all cut rows the same way, so the cut lives here once.
"""

from __future__ import annotations

import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from timelake.model.contract import Contract, transform_name
from timelake.model.iceberg_private import object_store_hash
from timelake.model.timeutil import US_PER_DAY, US_PER_HOUR, transform_range, transform_values
from timelake.ports.files import ObjectIO

try:
    from timelake.model import _runs  # compiled at install (_runs.c)
except ImportError:  # no compiler at install: numpy finds the runs
    _runs = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table as IcebergTable


@dataclass(frozen=True)
class PartitionKey:
    spec_id: int
    transform: str
    value: int

    @property
    def name(self) -> str:
        return f"{self.transform}-{self.value}-s{self.spec_id}"

    @property
    def range(self) -> tuple[int, int]:
        return transform_range(self.transform, self.value)


def micros(table: pa.Table, column: str) -> np.ndarray:
    """The time column as int64 UTC microseconds (no copy when possible)."""
    return pc.cast(table.column(column), pa.int64()).to_numpy()


def partition_codes(ts: np.ndarray, contract: Contract, cutoffs: list[int],
                    days: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, list[PartitionKey]]:
    """Per row an index into the returned list of partition keys. ``days``: the rows' distinct UTC day
    numbers and each row's index into them, when the caller has them already (a day-partitioned
    table's partitions are those days)."""
    if len(contract.tiers) == 1:  # one partition spec: no tier masks to build and apply
        tier = contract.tiers[0]
        if days is not None and tier.transform == "day":
            uniques, inverse = days
        else:
            uniques, inverse, _ = dense_unique(transform_values(ts, tier.transform))
        return inverse, [PartitionKey(tier.spec_id, tier.transform, int(v)) for v in uniques]
    tiers = contract.tier_index(ts, cutoffs)
    codes = np.empty(len(ts), dtype=np.int64)
    keys: list[PartitionKey] = []
    for i, tier in enumerate(contract.tiers):
        mask = tiers == i
        if not mask.any():
            continue
        values = transform_values(ts[mask], tier.transform)
        uniques, inverse, _ = dense_unique(values)
        codes[mask] = inverse + len(keys)
        keys.extend(PartitionKey(tier.spec_id, tier.transform, int(v)) for v in uniques)
    return codes, keys


def run_starts(values: np.ndarray, also: np.ndarray | None = None) -> np.ndarray:
    """Where each run of equal ``values`` (and equal ``also``, when given: a partition's code and a series
    bucket) starts, the first row included."""
    change = values[1:] != values[:-1]
    if also is not None:
        change |= also[1:] != also[:-1]
    return np.append(0, np.flatnonzero(change) + 1)


def run_starts_within(values: np.ndarray, limit: int) -> np.ndarray | None:
    """`run_starts` of one or more ``values`` where there are at most ``limit`` runs, else None. Compiled
    (`_runs.starts`), the search stops at the limit: values that change every row (the series of a day in
    time order) cost it a few thousand comparisons, where numpy compares them all and lists every change."""
    if _runs is not None and values.dtype in (np.int32, np.int64) and values.ndim == 1:
        out = np.empty(min(len(values), limit), dtype=np.int64)
        count = _runs.starts(np.ascontiguousarray(values), out, limit)
        return None if count < 0 else out[:count]
    starts = run_starts(values)
    return starts if len(starts) <= limit else None


@dataclass(frozen=True)
class TimeRuns:
    """A batch's runs of one time bucket (and one series): run i is rows ``starts[i]`` to
    ``starts[i + 1]`` (the last to the batch's end), None when there are more than asked for;
    ``lowest`` and ``highest`` bound its times."""

    starts: np.ndarray | None
    lowest: int
    highest: int


def run_width(contract: Contract) -> int:
    """The time bucket within which a row's partition cannot change, in every tier: an hour where a tier
    is cut by hours, else a day (tier cutoffs are floored to the coarser tier's granularity)."""
    return US_PER_HOUR if any(tier.transform == "hour" for tier in contract.tiers) else US_PER_DAY


def time_runs(times: np.ndarray, width: int, series: np.ndarray | None = None, limit: int | None = None) -> TimeRuns:
    """Where runs of equal ``floor(times / width)`` (and equal ``series``, int32 dictionary indices, when
    given) start, if there are at most ``limit``, and the times' bounds: one compiled pass (`_runs`), or
    numpy's several."""
    limit = len(times) if limit is None else limit
    if _runs is not None and times.dtype == np.int64 and (series is None or series.dtype == np.int32):
        out = np.empty(max(0, min(len(times), limit)), dtype=np.int64)
        count, lowest, highest = _runs.runs(np.ascontiguousarray(times), width, None if series is None else
                                            np.ascontiguousarray(series), out, limit)
        return TimeRuns(out[:count] if count >= 0 else None, lowest, highest)
    if len(times) == 0:
        return TimeRuns(np.zeros(0, dtype=np.int64), 0, 0)
    starts = run_starts(np.floor_divide(times, width), series)
    return TimeRuns(starts if len(starts) <= limit else None, int(times.min()), int(times.max()))


def dense_unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True, return_counts=True)`` for integers that span a small
    range, as partition and day numbers of a batch do: one counting pass instead of a sort, which
    was most of a scan's time on time-ordered sources. Values in long runs (the days of a batch of
    files per device, each in time order) are taken a run at a time: a pass to find the runs and one
    to lay out each row's index, 0.35 ms against 2.9 ms counting a 262k-row batch of two devices."""
    if len(values) == 0:
        return values[:0], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = run_starts(values)
    if len(starts) == 1:  # one value, as a batch of one day has: nothing to count
        return values[:1].copy(), np.zeros(len(values), dtype=np.int64), np.array([len(values)], dtype=np.int64)
    if len(starts) <= len(values) // RUN_ROWS:
        lengths = np.diff(np.append(starts, len(values)))
        present, of_run, counts = unique_of_runs(values[starts], lengths)
        return present, np.repeat(of_run, lengths), counts
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 4 * len(values) + 1024:  # sparse: counting would allocate more than sorting costs
        return np.unique(values, return_inverse=True, return_counts=True)
    offsets = values - lo
    counts = np.bincount(offsets, minlength=hi - lo + 1)
    present = np.flatnonzero(counts)
    position = np.zeros(len(counts), dtype=np.int64)
    position[present] = np.arange(len(present))
    return present + lo, position[offsets], counts[present]


def unique_of_runs(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`dense_unique` of runs: the distinct ``values`` (one a run), each run's index into them, and each
    value's rows (its runs' ``lengths`` summed)."""
    present, of_run = np.unique(values, return_inverse=True)
    return present, of_run.astype(np.int64), np.bincount(of_run, weights=lengths, minlength=len(present)).astype(np.int64)


def single_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``column`` as one array: no copy when it is one already or a chunked array of one chunk (Arrow's
    ``combine_chunks`` copies even a single chunk, a unit's column at a time)."""
    if isinstance(column, pa.Array):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def gather(rows: pa.Table, order: np.ndarray) -> pa.Table:
    """``rows.take(order)``, with ``order`` checked once by numpy's min and max. Arrow checks a take's indices
    once a column, and slowly: that check was 8 % of a backfill's instructions (callgrind, a day-ordered job at
    4x), more than the gathers themselves."""
    low, high = (int(order.min()), int(order.max())) if len(order) else (0, -1)
    if low < 0 or high >= rows.num_rows:
        raise IndexError(f"row {low if low < 0 else high} is not among the {rows.num_rows} rows taken from")
    return pc.take(rows, pa.array(order), boundscheck=False)


def by_index(values: np.ndarray, column: pa.DictionaryArray) -> pa.Array:
    """``values[column.indices]``, where ``values`` hold a number per entry of the dictionary column's dictionary:
    by Arrow's take, since numpy's gather by int32 indices widens them first and takes twice the time; a null
    stays null. Arrow's own check of the indices is spared: a dictionary array's indices are below its
    dictionary's length (Arrow checked them when it made it), so ``values`` holding as many covers them."""
    if len(values) < len(column.dictionary):
        raise IndexError(f"{len(values)} values for a dictionary of {len(column.dictionary)}")
    return pc.take(pa.array(values), column.indices, boundscheck=False)


def series_hash(table: pa.Table, series_key: tuple[str, ...]) -> np.ndarray:
    """A stable hash of the series key per row: the same series always lands in the same slice.

    Hashes each distinct value once (dictionary encoding), so the cost is per distinct series, not per row.
    """
    result = np.zeros(table.num_rows, dtype=np.uint64)
    for column in series_key:
        encoded = pc.dictionary_encode(table.column(column)).combine_chunks()
        dictionary = encoded.dictionary.to_pylist()
        hashes = np.array([zlib.crc32(repr(v).encode()) for v in dictionary], dtype=np.uint64)
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        result = result * np.uint64(1_000_003) + hashes[indices]
    return result


def series_codes(table: pa.Table, series_key: tuple[str, ...]) -> np.ndarray:
    """Per row a dense int64 code of its series key: equal codes exactly when the keys are equal (a null
    is a value of its own). Unlike `series_hash` it is not stable across tables, and never collides."""
    codes = None
    for column in series_key:
        encoded = pc.dictionary_encode(table.column(column), null_encoding="encode").combine_chunks()
        indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        if codes is None:
            codes = indices
            continue
        codes = codes * len(encoded.dictionary) + indices
        codes = np.unique(codes, return_inverse=True)[1].astype(np.int64)  # dense again: the product never overflows
    return np.zeros(table.num_rows, dtype=np.int64) if codes is None else codes


RUN_ROWS = 256  # rows a run of one code must average to be left in place, not ordered row by row
COUNTED_RANGE = 4096  # keys this close sort by Arrow's counting sort (pyarrow 26 counts up to this range)


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """The stable order of integer ``keys``: keys of a narrow range are counted, others radix-sorted
    where they fit 16 bits (`_integer_argsort`), both in linear time. Keys that come in long runs of
    one value (a unit's rows spilled from a file per series arrive as a run per series and flush)
    order their runs instead: the sort is of a few hundred run keys, and the order is the runs' row
    ranges laid end to end (1.2 ms for a per-device unit's 432,000 keys, where the radix sort takes 5.8)."""
    n = len(keys)
    if n >= 2 * RUN_ROWS:
        starts = run_starts_within(keys, n // RUN_ROWS)
        if starts is not None:
            sizes = np.diff(starts, append=n)
            by = _integer_argsort(keys[starts])
            return concat_ranges(starts[by], sizes[by])
    return _integer_argsort(keys)


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The integers of the ranges [starts[i], starts[i] + sizes[i]) one after another, without a Python
    loop: the row numbers of runs laid end to end. Compiled (`_runs.ranges`), it writes them in one pass
    with the interpreter free: numpy's cumulative sum of a per-device unit's 432,000 row numbers held it
    for about a millisecond, while the other writer thread waited. Without the compiled module, each
    range's first is written as the jump from the end of the one before, steps of one between, and summed
    in place."""
    if _runs is not None:
        starts, sizes = np.ascontiguousarray(starts, dtype=np.int64), np.ascontiguousarray(sizes, dtype=np.int64)
        return _runs.ranges(starts, sizes, np.empty(int(sizes.sum()), dtype=np.int64))
    out = np.ones(int(sizes.sum()), dtype=np.int64)
    if not len(out):
        return out
    present = sizes > 0
    starts, sizes = starts[present], sizes[present]
    firsts = np.cumsum(sizes) - sizes
    out[firsts[1:]] = starts[1:] - (starts[:-1] + sizes[:-1] - 1)
    out[0] = starts[0]
    return np.cumsum(out, out=out)


def tally(codes: np.ndarray, slots: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Per slot the sum of ``weights`` (one per row; None: the rows counted) of the rows whose code names it,
    as float64: numpy's ``bincount``, but compiled (`_runs.tally`) with the interpreter free and a
    dictionary's int32 codes taken as they are, not copied to numpy's index type first (a quarter of the time of
    counting a merge unit's day of main per series)."""
    if _runs is not None and codes.dtype in (np.int32, np.int64) and (weights is None or weights.dtype == np.float64):
        out = np.zeros(slots)
        _runs.tally(np.ascontiguousarray(codes), out, None if weights is None else np.ascontiguousarray(weights))
        return out
    return np.bincount(codes, weights=weights, minlength=slots).astype(np.float64, copy=False)


def _integer_argsort(keys: np.ndarray) -> np.ndarray:
    """The stable order of integer ``keys`` by the fastest sort their range allows. Arrow's ``sort_indices``
    counts keys that lie within `COUNTED_RANGE` of each other in one pass: 1.2 ms for the 432,000 series
    ranks of a day of 300 devices in time order, where numpy's radix sort of them as uint16 takes 4.4 ms.
    Past that range Arrow compares keys (ten times slower than numpy), so a wider range sorts in numpy."""
    if keys.dtype.kind not in "iu" or len(keys) == 0:
        return np.argsort(keys, kind="stable")
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo < COUNTED_RANGE:
        return _writable(pc.sort_indices(pa.array(keys)))
    small = lo >= 0 and hi < 1 << 16
    return np.argsort(keys.astype(np.uint16) if small else keys, kind="stable")


def _writable(values: pa.Array) -> np.ndarray:
    """An integer array that an Arrow kernel has just made, as int64 numpy over the same buffer, writable
    (``to_numpy`` gives a read-only view): callers drop rows from an order in place."""
    return np.frombuffer(values.buffers()[1], dtype=np.int64, count=len(values), offset=values.offset * 8)


def split_by_code(table: pa.Table, codes: np.ndarray) -> list[tuple[int, pa.Table]]:
    """Group rows by code, keeping their order within each group (one sort, then slices)."""
    order, runs = code_runs(codes)
    taken = table if order is None else gather(table, order)
    return [(code, taken.slice(lo, hi - lo)) for code, lo, hi in runs]


def code_runs(codes: np.ndarray, repeats: bool = False) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
    """The stable order that groups rows by code (None when they are grouped already, as a time-ordered
    source's partitions are), and each group as (code, first, end) in that order. With ``repeats``, rows
    that come in long runs of one code (batches of several time-ordered files joined) are left in place
    and each run is a group of its own, so a code may have several."""
    if len(codes) == 0:
        return None, []
    order = None
    starts = run_starts(codes)
    ordered = bool(np.all(codes[1:] >= codes[:-1]))
    if not ordered and not (repeats and len(starts) <= len(codes) // RUN_ROWS):
        order = stable_argsort(codes)
        codes = codes[order]
        starts = run_starts(codes)
    bounds = np.append(starts, len(codes)).tolist()
    return order, [(int(codes[lo]), lo, hi) for lo, hi in pairwise(bounds)]


def time_filter(column: str, start_us: int | None, end_us: int | None) -> BooleanExpression:
    """Iceberg row filter for [start, end) on the time column (None: unbounded), for pruning."""
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThan, Reference
    from pyiceberg.expressions.literals import literal

    from timelake.model.timeutil import from_micros

    result: BooleanExpression = AlwaysTrue()
    if start_us is not None:
        result = And(result, GreaterThanOrEqual(term=Reference(column), value=literal(from_micros(start_us).isoformat())))
    if end_us is not None:
        result = And(result, LessThan(term=Reference(column), value=literal(from_micros(end_us).isoformat())))
    return result


def read_range(
    table: IcebergTable, column: str, start_us: int | None, end_us: int | None, columns: tuple[str, ...] | None = None,
    ref: str | None = None, snapshot_id: int | None = None,
) -> pa.Table:
    """Rows of ``table`` (main, a branch, or a snapshot) in [start, end), pruned by partitions and file bounds."""
    return _range_scan(table, column, start_us, end_us, columns, ref, snapshot_id).to_arrow()


def stream_range(table: IcebergTable, column: str, start_us: int | None, end_us: int | None,
                 columns: tuple[str, ...] | None = None, *, objects: ObjectIO) -> pa.RecordBatchReader:
    """`read_range` as batches, for a consumer that aggregates them: memory holds a batch, not the range.

    pyiceberg's own batch reader holds a whole data file at a time (a 128 MB file is 1 GB of Arrow), so a
    file whose columns carry field ids and that has no delete files is read here row group by row group,
    its columns picked by field id (a renamed column still matches). Any other file goes through pyiceberg.
    ``columns`` must hold ``column``, which filters the rows."""
    from timelake.model.lineage import main_tasks

    scan = _range_scan(table, column, start_us, end_us, columns)
    return _stream_tasks(scan, main_tasks(table, scan.row_filter), column, start_us, end_us, objects=objects)


@dataclass(frozen=True)
class _Projection:
    """What reading a scan's files needs of its projection, worked out once per scan: pyiceberg builds
    the projection and its Arrow schema in Python under the interpreter lock, half a millisecond that
    every unit's read of main paid again while the other writers waited."""

    projection: Any
    schema: pa.Schema  # with the ``dictionaries`` columns dictionary-encoded
    ids: dict[int, str]  # field id -> column name
    dictionaries: tuple[str, ...]

    @classmethod
    def of(cls, scan: Any, dictionaries: tuple[str, ...] = ()) -> _Projection:
        """The scan's columns as the table names them now, found in every file by field id: pyiceberg's own
        projection of a scan at a snapshot takes that snapshot's schema, in which a column another engine
        renamed since has its old name (and the new one is not found)."""
        current = scan.table_metadata.schema()
        fields = scan.selected_fields
        projection = current if "*" in fields else current.select(*fields, case_sensitive=scan.case_sensitive)
        plain = projection.as_arrow()
        schema = pa.schema([f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in dictionaries else f for f in plain],
                           metadata=plain.metadata)
        return cls(projection, schema, {f.field_id: f.name for f in projection.fields}, dictionaries)


def _stream_tasks(scan: Any, tasks: Any, column: str, start_us: int | None, end_us: int | None,
                  projected: _Projection | None = None, inside: frozenset[int] = frozenset(), *,
                  objects: ObjectIO) -> pa.RecordBatchReader:
    """The rows of ``scan``'s planned ``tasks`` in [start, end), a row group at a time where the file allows;
    the text columns named in ``projected.dictionaries`` dictionary-encoded (read so from Parquet: a few
    thousand series, not a string a row). ``inside``: the places in ``tasks`` of files whose time bounds lie
    in [start, end), whose rows need no filter (a day of main read for a day's unit: 0.2 ms a read)."""
    from pyiceberg.io.pyarrow import ArrowScan

    projected = projected or _Projection.of(scan)
    schema, ids, dictionaries = projected.schema, projected.ids, projected.dictionaries

    def batches() -> Iterator[pa.RecordBatch]:
        for place, task in enumerate(tasks):
            fs, path = objects.filesystem(task.file.file_path, scan.io)
            with fs.open_input_file(path) as handle:
                parquet = pq.ParquetFile(handle)  # its footer, parsed once for both readers
                by_id = {int(f.metadata[b"PARQUET:field_id"]): f.name for f in parquet.schema_arrow
                         if f.metadata and b"PARQUET:field_id" in f.metadata}
                if task.delete_files or not set(ids) <= set(by_id):
                    for batch in ArrowScan(scan.table_metadata, scan.io, projected.projection, time_filter(column, start_us, end_us),
                                           scan.case_sensitive).to_record_batches([task]):
                        yield from _encoded(pa.Table.from_batches([batch]), schema, dictionaries).to_batches()
                    continue
                stored = [by_id[i] for i, name in ids.items() if name in dictionaries]
                if stored:
                    parquet = pq.ParquetFile(handle, metadata=parquet.metadata, read_dictionary=stored)
                # decoded by the reading thread: readers run a unit or a task each, as many as there are
                # cores, and Arrow's pool decoding their columns too only made them wait for one another
                for batch in parquet.iter_batches(batch_size=1 << 20, columns=[by_id[i] for i in ids], use_threads=False):
                    rows = pa.Table.from_batches([batch]).rename_columns(list(ids.values()))
                    if place in inside and not rows.column(column).null_count:  # a null time is in no range
                        yield from _encoded(rows, schema, dictionaries).to_batches()
                        continue
                    ts = micros(rows, column)
                    keep = np.ones(len(ts), dtype=bool)
                    if start_us is not None:
                        keep &= ts >= start_us
                    if end_us is not None:
                        keep &= ts < end_us
                    yield from _encoded(rows if keep.all() else rows.filter(pa.array(keep)), schema, dictionaries).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


def _encoded(rows: pa.Table, schema: pa.Schema, dictionaries: tuple[str, ...]) -> pa.Table:
    """``rows`` in ``schema``: the columns named in ``dictionaries`` dictionary-encoded (as they are when
    read so), the others cast."""
    if not dictionaries:
        return rows.cast(schema)
    columns = []
    for f in schema:
        column = rows.column(f.name)
        if f.name in dictionaries and not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column.cast(f.type.value_type))
        columns.append(column.cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _range_scan(table: IcebergTable, column: str, start_us: int | None, end_us: int | None,
                columns: tuple[str, ...] | None, ref: str | None = None, snapshot_id: int | None = None) -> Any:
    scan = table.scan(row_filter=time_filter(column, start_us, end_us), selected_fields=columns or ("*",),
                      snapshot_id=snapshot_id)
    return scan.use_ref(ref) if ref else scan


def read_task(table: IcebergTable, task: Any, columns: tuple[str, ...] | None = None) -> pa.Table:
    """The rows of one planned file of ``table`` (any writer's: its deletes applied, its columns found
    by field id and named as the table names them now), in the table's current schema, with field ids:
    what a rewrite of another engine's file writes back."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    schema = table.schema() if columns is None else table.schema().select(*columns)
    rows = ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table([task])
    return rows.cast(schema.as_arrow())


class SnapshotRange:
    """One snapshot's rows in [start, end), planned once and then read piece by piece, as batches.

    Validation compares each staged file with main's rows in that file's partition, and a writer in merge
    mode its unit with main's rows in the unit's range. Planning once and reading only the data files whose
    time bounds meet a piece, a row group at a time, holds a batch of main, not a partition of it.
    """

    def __init__(self, table: IcebergTable, column: str, start_us: int | None, end_us: int | None,
                 columns: tuple[str, ...], snapshot_id: int | None = None, keep: Callable[[Any], bool] | None = None, *,
                 objects: ObjectIO) -> None:
        """``keep``: only the snapshot's files whose manifest entries it accepts (`lineage.Lineage.accepts`)."""
        from timelake.model.lineage import main_tasks

        self._column = column
        self._objects = objects
        self._scan = table.scan(row_filter=time_filter(column, start_us, end_us), selected_fields=columns,
                                snapshot_id=snapshot_id)
        field = table.schema().find_field(column)
        tasks = main_tasks(table, self._scan.row_filter, keep, snapshot_id)
        self._tasks = [(*file_bounds(task.file, field), task) for task in tasks]
        self._projected: dict[tuple[str, ...], _Projection] = {}

    def batches(self, start_us: int, end_us: int, dictionaries: tuple[str, ...] = ()) -> pa.RecordBatchReader:
        """The snapshot's rows in [start, end), which must lie inside the planned range (``dictionaries``:
        text columns to read dictionary-encoded)."""
        chosen = [(lo, hi, task) for lo, hi, task in self._tasks if lo is None or hi is None or (lo < end_us and hi >= start_us)]
        inside = frozenset(i for i, (lo, hi, _) in enumerate(chosen) if lo is not None and hi is not None and start_us <= lo and hi < end_us)
        projected = self._projected.get(dictionaries)
        if projected is None:  # a race only builds it twice
            projected = self._projected[dictionaries] = _Projection.of(self._scan, dictionaries)
        return _stream_tasks(self._scan, [task for _, _, task in chosen], self._column, start_us, end_us, projected, inside,
                             objects=self._objects)


class MainReader:
    """Main's rows for the units that one process writes in merge mode: main is planned once per
    snapshot over the job's range, then read unit by unit, a batch at a time.

    Planning is pyiceberg Python that holds the GIL (about 7 ms a unit on a small table, more with many
    manifests), so writer threads planning a unit each slowed one another; one plan serves them all
    until a live commit moves main. A writer on its own (a Lambda, a pool process) plans its unit only.
    Writers that loaded main before and after a live commit each read their own snapshot: the plans of
    the last `KEPT_PLANS` snapshots are kept, so that taking turns does not plan again and again.
    """

    KEPT_PLANS: ClassVar[int] = 2  # snapshots planned at once: tasks that loaded main before and after a live commit

    def __init__(self, column: str, start_us: int, end_us: int, columns: tuple[str, ...], *, objects: ObjectIO,
                 dictionaries: tuple[str, ...] = ()) -> None:
        """``dictionaries``: the text columns to read dictionary-encoded (the series key), which packs and
        counts main's keys per distinct series, not per row."""
        self._range = (column, start_us, end_us, columns)
        self._objects = objects
        self._dictionaries = dictionaries
        self._plans: dict[int, SnapshotRange] = {}
        self._lock = threading.Lock()

    def batches(self, table: IcebergTable, start_us: int, end_us: int) -> pa.RecordBatchReader:
        snapshot = table.current_snapshot()
        if snapshot is None:
            return stream_range(table, self._range[0], start_us, end_us, self._range[3], objects=self._objects)
        with self._lock:
            plan = self._plans.get(snapshot.snapshot_id)
            if plan is None:
                while len(self._plans) >= self.KEPT_PLANS:
                    del self._plans[next(iter(self._plans))]
                column, lo, hi, columns = self._range
                plan = self._plans[snapshot.snapshot_id] = SnapshotRange(table, column, lo, hi, columns, snapshot.snapshot_id,
                                                                         objects=self._objects)
        return plan.batches(start_us, end_us, self._dictionaries)


def data_location(table: IcebergTable, partition: str, name: str) -> str:
    """Where a new data file ``name`` of the partition at path ``partition`` goes, as Iceberg Java's location
    providers place it: under ``write.data.path`` (or the older ``write.object-storage.path`` and
    ``write.folder-storage.path``), else ``data/`` under the table's location; with
    ``write.object-storage.enabled``, under directories hashed from the partition path and name, then, where the
    data path lies outside the table's location, the table's namespace and name, as Java adds them."""
    props = table.properties
    location = table.location().rstrip("/")
    hashed = props.get(OBJECT_STORAGE, "false").strip().lower() == "true"
    data = (props.get("write.data.path") or (props.get("write.object-storage.path") if hashed else None)
            or props.get("write.folder-storage.path") or f"{location}/data").rstrip("/")
    if not hashed:
        return f"{data}/{partition}/{name}"
    with_partition = props.get(OBJECT_STORAGE_PARTITIONED, "true").strip().lower() == "true"
    file = f"{partition}/{name}" if with_partition else name
    hash_dirs = object_store_hash(file)
    if not data.startswith(location):
        return f"{data}/{hash_dirs}/{'/'.join(location.split('/')[-2:])}/{file}"
    return f"{data}/{hash_dirs}/{file}" if with_partition else f"{data}/{hash_dirs}-{file}"


OBJECT_STORAGE = "write.object-storage.enabled"
OBJECT_STORAGE_PARTITIONED = "write.object-storage.partitioned-paths"


def file_bounds(file: Any, field: Any) -> tuple[int | None, int | None]:
    """A data file's lower and upper time bound (inclusive, UTC µs) from its manifest entry; None if unknown."""
    lo, hi = (file.lower_bounds or {}).get(field.field_id), (file.upper_bounds or {}).get(field.field_id)
    return (None if lo is None else int_from_bytes(field.field_type, lo),
            None if hi is None else int_from_bytes(field.field_type, hi))


def partition_span(table: IcebergTable, file: Any, column: str) -> tuple[int, int] | None:
    """[start, end) in UTC µs of a file's partition where its spec partitions by an hour, day, month or year of
    ``column``; None where it does not."""
    field_id = table.schema().find_field(column).field_id
    spec = table.specs().get(file.spec_id)
    for i, field in enumerate(spec.fields if spec is not None else ()):
        name = transform_name(field.transform)
        if field.source_id == field_id and name is not None and file.partition[i] is not None:
            return transform_range(name, file.partition[i])
    return None


def equality_deletes(table: IcebergTable, column: str, start_us: int | None, end_us: int | None) -> list[str]:
    """Main's live equality delete files (a Flink upsert writes them) that may delete rows of [start, end):
    pyiceberg, which reads main for every job, applies position deletes but stops at an equality delete in
    what it plans. A file spans its bounds on ``column``; without them its time partition; without one of
    those, all time."""
    from pyiceberg.manifest import DataFileContent, ManifestContent

    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    field = table.schema().find_field(column)
    found = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content != DataFileContent.EQUALITY_DELETES:
                continue
            lo, hi = file_bounds(entry.data_file, field)
            if (lo is None or hi is None) and (span := partition_span(table, entry.data_file, column)) is not None:
                lo, hi = span[0], span[1] - 1
            if (lo is None or end_us is None or lo < end_us) and (hi is None or start_us is None or hi >= start_us):
                found.append(entry.data_file.file_path)
    return found


def int_from_bytes(value_type: Any, raw: bytes) -> int:
    """A serialized Iceberg value that is an integer: a timestamp bound (µs) or a time transform's
    partition value. pyiceberg types ``from_bytes`` by its first possible result (str), so callers
    that know the value is an int say so here, once."""
    from pyiceberg.conversions import from_bytes

    return cast(int, from_bytes(value_type, raw))


def fresh_schema(schema: pa.Schema) -> Schema:
    """An Iceberg schema for an Arrow schema of our own making (rollups, events), with fresh field ids."""
    from timelake.model.iceberg_private import fresh_schema as converted

    return converted(schema)


def time_bounds(table: IcebergTable, column: str) -> tuple[int, int] | None:
    """Oldest and newest time on main (UTC µs) from the data files' column bounds: no data is read. A file
    whose manifest entry has none (the table's metrics modes, ``write.metadata.metrics.*``, keep them out)
    gives its footer's."""
    field = table.schema().find_field(column)
    lows, highs, unknown = [], [], []
    for task in table.scan().plan_files():
        lo, hi = file_bounds(task.file, field)
        if lo is None or hi is None:
            unknown.append(task.file.file_path)
            continue
        lows.append(lo)
        highs.append(hi)
    for found in _footer_times(table, unknown, column):
        if found is not None:
            lows.append(found[0])
            highs.append(found[1])
    return (min(lows), max(highs)) if lows else None


def _footer_times(table: IcebergTable, paths: list[str], column: str) -> list[tuple[int, int] | None]:
    """Each file's oldest and newest ``column`` time (UTC µs) as its Parquet footer has them."""
    def one(path: str) -> tuple[int, int] | None:
        with table.io.new_input(path).open(seekable=True) as handle:
            found = footer_bounds(pq.read_metadata(handle), column)
        if found is None or not pa.types.is_timestamp(found[0]):
            return None
        per_us = {"s": 1_000_000, "ms": 1_000, "us": 1}.get(found[0].unit)
        return (found[1] * per_us, found[2] * per_us) if per_us else (found[1] // 1_000, found[2] // 1_000)

    if len(paths) <= 1:
        return [one(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:  # on an object store a footer costs its latency
        return list(pool.map(one, paths))


def footer_bounds(metadata: pq.FileMetaData, column: str) -> tuple[pa.DataType, int, int, int] | None:
    """``column``'s (type, min, max, rows) from a Parquet file's row-group statistics, for signed integer
    and timestamp columns without nulls (min and max in the column's own unit); None where they do not tell."""
    arrow = metadata.schema.to_arrow_schema()
    if column not in arrow.names:
        return None
    kind = arrow.field(column).type
    if not (pa.types.is_signed_integer(kind) or pa.types.is_timestamp(kind)):
        return None
    if metadata.num_rows == 0:
        return kind, 0, 0, 0
    index = arrow.get_field_index(column)
    lows, highs = [], []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max or stats.null_count or stats.physical_type not in ("INT32", "INT64"):
            return None
        lows.append(stats.min_raw)
        highs.append(stats.max_raw)
    return kind, min(lows), max(highs), metadata.num_rows
