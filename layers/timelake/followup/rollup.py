"""Rollups: per series key and time bucket, count/min/max/sum/avg of chosen columns, kept correct
after a backfill.

Definitions live in the base table's contract (property ``timelake.rollups``); each rollup is an
ordinary Iceberg table ``<table>_<interval>``. A "Backfill Published" event names the changed range;
the refresher widens it to whole buckets and, chunk by chunk (a day of hourly buckets, a month of
daily ones), recomputes the buckets from the base table and swaps them in ONE transaction (delete
the chunk's rollup rows + append the new ones): a reader sees the old chunk or the new one, never a
mix. Buckets whose rows all disappeared (replace mode) simply get no new row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform, MonthTransform

from timelake.model.commit import swap
from timelake.model.contract import Contract
from timelake.model.layout import fresh_schema, stream_range, time_filter
from timelake.model.timeutil import US_PER_DAY, US_PER_HOUR, floor_to, next_boundary, parse_instant, to_micros
from timelake.ports.runtime import Runtime

if TYPE_CHECKING:
    import duckdb

ROLLUPS = "timelake.rollups"
INTERVALS = {"1h": US_PER_HOUR, "1d": US_PER_DAY}
CHUNK = {"1h": "day", "1d": "month"}  # one atomic swap per chunk
AGGREGATES = ("min", "max", "sum", "avg")
Progress = Callable[[int, int, str], None]  # (chunks done, chunks in all, what is being refreshed)
DUCKDB_MEMORY = "256MB"  # per chunk; up to 4 chunks at once. The groups (series x buckets) are what it holds


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
        transform = DayTransform() if r.interval == "1h" else MonthTransform()
        spec = PartitionSpec(PartitionField(iceberg.find_field("bucket_start").field_id, 1000, transform, "bucket_part"))
        rt.catalog.create_table(r.table_name(base), schema=iceberg, partition_spec=spec,
                                properties={"timelake.rollup-of": base, "timelake.rollup-interval": r.interval})


def rollup_schema(contract: Contract, schema: pa.Schema, r: Rollup) -> pa.Schema:
    fields = [pa.field(k, schema.field(k).type, nullable=False) for k in contract.series_key]
    fields += [pa.field("bucket_start", pa.timestamp("us", tz="UTC"), nullable=False), pa.field("rows", pa.int64(), nullable=False)]
    fields += [pa.field(f"{c}_{a}", pa.float64()) for c in r.columns for a in AGGREGATES]
    return pa.schema(fields)


def refresh(rt: Runtime, base: str, start: str, end: str, progress: Progress | None = None) -> dict[str, int]:
    """Recompute every rollup of ``base`` over [start, end) widened to whole buckets; returns buckets per
    rollup. ``progress(done, total, rollup)`` is told of each chunk swapped in, over all the rollups."""
    table = rt.load_table(base)
    contract = Contract.from_table(table)
    lo, hi = to_micros(parse_instant(start)), to_micros(parse_instant(end))
    plan = [(r, _chunks(lo, hi, CHUNK[r.interval])) for r in rollups_of(table)]
    total, swapped = sum(len(bounds) for _, bounds in plan), 0
    done = {}
    for r, bounds in plan:
        target = rt.load_table(r.table_name(base))
        schema = target.schema().as_arrow()
        if progress:
            progress(swapped, total, r.table_name(base))
        buckets = 0
        with ThreadPoolExecutor(max_workers=4) as pool:  # chunks are computed in parallel ...
            fresh = pool.map(lambda b: _compute_chunk(table, contract, r, schema, *b), bounds)
            for (lo_, hi_), rows in zip(bounds, fresh):  # ... and swapped in order, one transaction each
                swap(target, time_filter("bucket_start", lo_, hi_), rows, f"rollup {r.interval}")
                buckets += rows.num_rows
                swapped += 1
                if progress:
                    progress(swapped, total, r.table_name(base))
        done[r.table_name(base)] = buckets
    return done


def _chunks(lo: int, hi: int, chunk: str) -> list[tuple[int, int]]:
    """[lo, hi) as whole chunks (days or months), each swapped in one transaction."""
    bounds = []
    edge = floor_to(lo, chunk)
    while edge < hi:
        bounds.append((edge, next_boundary(edge, chunk)))
        edge = bounds[-1][1]
    return bounds


def compute(rows: pa.Table | pa.RecordBatchReader, contract: Contract, r: Rollup, schema: pa.Schema) -> pa.Table:
    """The rollup rows of ``rows`` (DuckDB group-by over Arrow; a reader is consumed batch by batch, and
    the group-by spills past ``DUCKDB_MEMORY``)."""
    import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
    keys = ", ".join(f'"{k}"' for k in contract.series_key)
    width = INTERVALS[r.interval]
    aggregates = ", ".join(f'{a}("{c}")::DOUBLE AS "{c}_{a}"' for c in r.columns for a in AGGREGATES)
    con = duckdb.connect(config={"memory_limit": DUCKDB_MEMORY})
    con.execute("SET enable_progress_bar = false")
    con.register("base", rows)
    sql = (f'SELECT {keys}, make_timestamptz(((epoch_us("{contract.time_column}") // {width}) * {width})::BIGINT) AS bucket_start, '
           f'count(*) AS rows{", " + aggregates if aggregates else ""} FROM base GROUP BY ALL ORDER BY ALL')
    return con.sql(sql).to_arrow_table().cast(schema)


def _compute_chunk(table: Any, contract: Contract, r: Rollup, schema: pa.Schema, lo: int, hi: int) -> pa.Table:
    rows = stream_range(table, contract.time_column, lo, hi, (*contract.series_key, contract.time_column, *r.columns))
    return compute(rows, contract, r, schema)
