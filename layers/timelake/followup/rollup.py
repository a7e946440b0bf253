"""Rollups: per series key and time bucket, count/min/max/sum/avg of chosen columns, kept correct
after a backfill.

Definitions live in the base table's contract (property ``timelake.rollups``); each rollup is an
ordinary Iceberg table ``<table>_<interval>``. A "Backfill Published" event names the changed range;
the refresher widens it to whole chunks (a day of hourly buckets, a month of daily ones), recomputes
the buckets chunk by chunk from the base table and swaps the whole range in ONE transaction (delete
the range's rollup rows + add the new ones): a reader sees the old range or the new one, never a
mix. Buckets whose rows all disappeared (replace mode) simply get no new row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform, MonthTransform

from timelake.model.commit import COMMIT_ATTEMPTS, since, summary_value, swap, write_rows
from timelake.model.contract import Contract
from timelake.model.layout import fresh_schema, stream_range, time_filter
from timelake.model.timeutil import (
    US_PER_DAY,
    US_PER_HOUR,
    floor_to,
    iso,
    next_boundary,
    parse_instant,
    to_micros,
)
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime

if TYPE_CHECKING:
    import duckdb

ROLLUPS = "timelake.rollups"
INTERVALS = {"1h": US_PER_HOUR, "1d": US_PER_DAY}
CHUNK = {"1h": "day", "1d": "month"}  # one rollup table partition; computed as a piece, on a thread
RANGE = "timelake.rollup-range"  # snapshot summary: the [start, end) in UTC µs a refresh swapped in
AGGREGATES = ("min", "max", "sum", "avg")
WORKERS = 4  # chunks computed at once
DUCKDB_MEMORY = "1GB"  # for those chunks together. The groups (series x buckets) are what it holds
Progress = Callable[[int, int, str], None]  # (chunks done, chunks in all, what is being refreshed)


@dataclass(frozen=True)
class Rollup:
    interval: str
    columns: tuple[str, ...]

    def table_name(self, base: str) -> str:
        return f"{base}_{self.interval}"


def parse(definitions: list[dict[str, Any]] | None, schema: pa.Schema) -> list[Rollup]:
    """Rollup definitions checked against the base schema: ``[{"interval": "1h", "columns": ["value"]}]``."""
    rollups = []
    for d in definitions or []:
        if d.get("interval") not in INTERVALS:
            raise ValueError(f"rollup interval '{d.get('interval')}' is not one of {', '.join(INTERVALS)}")
        columns = tuple(d.get("columns", ()))
        for c in columns:
            if c not in schema.names or not (pa.types.is_integer(schema.field(c).type) or pa.types.is_floating(schema.field(c).type)):
                raise ValueError(f"rollup column '{c}' is not a numeric column of the table")
        rollups.append(Rollup(d["interval"], columns))
    return rollups


def to_property(rollups: list[Rollup]) -> str:
    return json.dumps([{"interval": r.interval, "columns": list(r.columns)} for r in rollups])


def rollups_of(table: Any) -> list[Rollup]:
    return [Rollup(d["interval"], tuple(d["columns"])) for d in json.loads(table.properties.get(ROLLUPS, "[]"))]


def create_tables(rt: Runtime, base: str, contract: Contract, schema: pa.Schema, rollups: list[Rollup]) -> None:
    """One Iceberg table per rollup, partitioned by day (hourly buckets) or month (daily ones)."""
    for r in rollups:
        iceberg = fresh_schema(rollup_schema(contract, schema, r))
        transform: DayTransform | MonthTransform = DayTransform() if r.interval == "1h" else MonthTransform()
        spec = PartitionSpec(PartitionField(iceberg.find_field("bucket_start").field_id, 1000, transform, "bucket_part"))
        rt.catalog.create_table(r.table_name(base), schema=iceberg, partition_spec=spec,
                                properties={"timelake.rollup-of": base, "timelake.rollup-interval": r.interval})


def rollup_schema(contract: Contract, schema: pa.Schema, r: Rollup) -> pa.Schema:
    fields = [pa.field(k, schema.field(k).type, nullable=False) for k in contract.series_key]
    fields += [pa.field("bucket_start", pa.timestamp("us", tz="UTC"), nullable=False), pa.field("rows", pa.int64(), nullable=False)]
    fields += [pa.field(f"{c}_{a}", pa.float64()) for c in r.columns for a in AGGREGATES]
    return pa.schema(fields)


def refresh(rt: Runtime, base: str, start: str, end: str, progress: Progress | None = None) -> dict[str, int]:
    """Recompute every rollup of ``base`` over [start, end) widened to whole chunks, one commit per
    rollup; returns the rollup rows written per rollup table. ``progress(done, total, rollup)`` is
    told of each chunk computed, over all the rollups."""
    table = rt.load_table(base)
    lo, hi = to_micros(parse_instant(start)), to_micros(parse_instant(end))
    plan = [(r, widen(r, lo, hi)) for r in rollups_of(table)]
    total, done = sum(len(chunks(r, *span)) for r, span in plan), 0

    def tick(name: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, name)

    if progress:
        progress(0, total, base)
    return {r.table_name(base): refresh_range(rt, base, r, *span, partial(tick, r.table_name(base))) for r, span in plan}


def widen(r: Rollup, lo: int, hi: int) -> tuple[int, int]:
    """[lo, hi) widened to whole chunks of ``r`` (days of hourly buckets, months of daily ones)."""
    chunk = CHUNK[r.interval]
    return (floor_to(lo, chunk), next_boundary(hi - 1, chunk)) if hi > lo else (lo, lo)


def chunks(r: Rollup, lo: int, hi: int) -> list[tuple[int, int]]:
    """The chunks of ``r`` in [lo, hi): each one rollup table partition."""
    bounds = []
    while lo < hi:
        bounds.append((lo, next_boundary(lo, CHUNK[r.interval])))
        lo = bounds[-1][1]
    return bounds


@dataclass
class Prepared:
    """A range of one rollup computed from the base table and written as data files of the rollup
    table, not yet committed. ``seen`` is the rollup table's snapshot when it was loaded, which was
    before the base table was read."""

    rollup: Rollup
    target: Any
    seen: int | None
    lo: int
    hi: int
    files: list[DataFile]
    rows: int


def refresh_range(rt: Runtime, base: str, r: Rollup, lo: int, hi: int,
                  chunk_done: Callable[[], None] | None = None) -> int:
    """The unit of work: rollup ``r`` over [lo, hi), whole chunks (see `widen`), recomputed from the
    base table and swapped in with ONE commit, so a reader sees the old range or the new one. Returns
    the rollup rows written. Work fanned out over several workers calls this once per range.

    Chunks are computed on threads and each is written to data files as it is done, so memory holds a
    few chunks whatever the range's length. (A commit per chunk made a month's refresh 30 commits,
    each planning a table that had grown with the one before.)"""
    for _ in range(COMMIT_ATTEMPTS):
        prepared = prepare_range(rt, base, r, lo, hi, chunk_done)
        if commit_range(prepared):
            return prepared.rows
    raise RuntimeError(f"rollup {r.interval} of {base}: other refreshes of [{iso(lo)}, {iso(hi)}) kept committing "
                       "first; run the refresh again")


def prepare_range(rt: Runtime, base: str, r: Rollup, lo: int, hi: int,
                  chunk_done: Callable[[], None] | None = None) -> Prepared:
    """`refresh_range`'s first half: the range's rollup rows, computed and written, not committed."""
    if widen(r, lo, hi) != (lo, hi):
        raise ValueError(f"rollup {r.interval}: [{iso(lo)}, {iso(hi)}) is not whole {CHUNK[r.interval]}s")
    target = rt.load_table(r.table_name(base))  # before the base: a refresh that commits after this is seen
    snapshot = target.current_snapshot()
    files, rows = _write(rt.load_table(base), target, r, lo, hi, chunk_done, objects=rt.objects)
    return Prepared(r, target, snapshot.snapshot_id if snapshot else None, lo, hi, files, rows)


def commit_range(prepared: Prepared) -> bool:
    """`refresh_range`'s second half: delete the range's rollup rows and add the prepared files, in one
    commit. Returns False, and removes the files, if a refresh of an overlapping range (or a commit
    that does not say what it touched) went in since the rollup table was loaded: that refresh may
    have read a newer base table, so the newest reading of the base wins, never the last writer. A
    commit of a range that does not overlap only makes this one retry on fresh metadata."""
    p = prepared
    if p.lo == p.hi:
        return True
    try:
        swap(p.target, time_filter("bucket_start", p.lo, p.hi), p.files, f"rollup {p.rollup.interval}",
             {RANGE: f"{p.lo}:{p.hi}"}, check=lambda current: _not_overlapped(current, p.seen, p.lo, p.hi))
    except _Overlapped:
        for f in p.files:
            p.target.io.delete(f.file_path)
        return False
    return True


class _Overlapped(Exception):
    """Raised from inside the commit's retry loop to leave it: the rows must be computed again."""


def _not_overlapped(current: Any, seen: int | None, lo: int, hi: int) -> None:
    """Raise `_Overlapped` if a commit since snapshot ``seen`` touched [lo, hi) or does not say what it touched."""
    for snapshot in since(current, seen):
        span = summary_value(snapshot, RANGE)
        other = tuple(map(int, span.split(":"))) if span else None
        if other is None or (other[0] < hi and lo < other[1]):
            raise _Overlapped


def _write(table: Any, target: Any, r: Rollup, lo: int, hi: int,
           chunk_done: Callable[[], None] | None = None, *, objects: ObjectIO) -> tuple[list[DataFile], int]:
    """Each chunk's rollup rows computed (on threads) and written as data files of ``target``, not committed."""
    import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
    contract = Contract.from_table(table)
    schema = target.schema().as_arrow()
    columns = (*contract.series_key, contract.time_column, *r.columns)
    db = duckdb.connect(config={"memory_limit": DUCKDB_MEMORY, "enable_external_access": False})  # opening one: 16 ms of CPU

    def one(bounds: tuple[int, int]) -> tuple[list[DataFile], int]:
        with db.cursor() as con:
            rows = compute(con, stream_range(table, contract.time_column, *bounds, columns, objects=objects), contract, r, schema)
        return write_rows(target, rows), rows.num_rows

    with db, ThreadPoolExecutor(max_workers=WORKERS) as pool:
        written = []
        for result in pool.map(one, chunks(r, lo, hi)):  # told here, in order, not from the threads
            written.append(result)
            if chunk_done:
                chunk_done()
    return [f for files, _ in written for f in files], sum(n for _, n in written)


def compute(con: duckdb.DuckDBPyConnection, rows: pa.Table | pa.RecordBatchReader, contract: Contract, r: Rollup,
            schema: pa.Schema) -> pa.Table:
    """The rollup rows of ``rows`` (DuckDB group-by over Arrow on ``con``; a reader is consumed batch by
    batch, and the group-by spills past the database's memory limit)."""
    keys = ", ".join(f'"{k}"' for k in contract.series_key)
    width = INTERVALS[r.interval]
    aggregates = ", ".join(f'{a}("{c}")::DOUBLE AS "{c}_{a}"' for c in r.columns for a in AGGREGATES)
    con.execute("SET enable_progress_bar = false")
    con.register("base", rows)
    sql = (f'SELECT {keys}, make_timestamptz(((epoch_us("{contract.time_column}") // {width}) * {width})::BIGINT) AS bucket_start, '
           f'count(*) AS rows{", " + aggregates if aggregates else ""} FROM base GROUP BY ALL ORDER BY ALL')
    return con.sql(sql).to_arrow_table().cast(schema)
