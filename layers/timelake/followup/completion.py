"""The completion signal: a table's coverage per partition, kept in a companion Iceberg table.

A dashboard or any Iceberg reader (DuckDB, Spark, Trino) cannot call our CLI, yet must know whether
the history it aggregates is whole. So after every publish (and live commits that ask for it) the
coverage of the affected partitions is written to ``<namespace>.<table>__coverage``: one row per
partition with its rows, expected rows, status (complete|partial|has_data|backfilling|gap), last writer and
update time. The affected partitions are replaced in one commit, so a reader never sees a
half-updated picture. It is derived data: ``refresh`` rebuilds it whole from the table's metadata.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable

from timelake.followup.coverage import CoverageMap, compute
from timelake.model.commit import swap
from timelake.model.layout import read_range, time_filter
from timelake.model.timeutil import parse_instant, to_micros
from timelake.ports.runtime import Runtime

SUFFIX = "__coverage"
COVERAGE_OF = "timelake.coverage-of"
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([
    pa.field("partition", pa.string(), nullable=False),
    pa.field("partition_start", TS, nullable=False),
    pa.field("partition_end", TS, nullable=False),
    pa.field("rows", pa.int64(), nullable=False),
    pa.field("files", pa.int32(), nullable=False),
    pa.field("expected", pa.int64()),
    pa.field("status", pa.string(), nullable=False),
    pa.field("last_writer", pa.string()),
    pa.field("backfill_job", pa.string()),
    pa.field("updated_at", TS, nullable=False),
])


def companion_name(table_name: str) -> str:
    return f"{table_name}{SUFFIX}"


def update(rt: Runtime, table_name: str, start: int | None = None, end: int | None = None, create: bool = True,
           known: dict[str, list[DataFile]] | None = None) -> int:
    """Recompute the coverage of the partitions overlapping [start, end) (UTC µs; both None: the whole
    table, dropping rows of partitions that no longer exist) and swap them in; returns rows written.
    ``create=False`` only corrects an existing companion (an abort must not start one). ``known``:
    manifests the caller just committed, with their files (`coverage.file_stats`)."""
    if not create and not rt.catalog.table_exists(companion_name(".".join(rt.load_table(table_name).name()[-2:]))):
        return 0
    cmap = compute(rt, table_name, start, end, by="partition", known=known)
    target = _companion(rt, cmap.table)
    rows = to_rows(cmap)
    whole = start is None and end is None
    affected = AlwaysTrue() if whole else time_filter("partition_start", cmap.start, cmap.end)
    swap(target, affected, rows, f"coverage of {cmap.table}")
    return rows.num_rows


def read(rt: Runtime, table_name: str, start: str | datetime | None = None, end: str | datetime | None = None) -> pa.Table:
    """The companion rows (partitions starting in [start, end)), oldest first; empty before the first update."""
    try:
        target = rt.catalog.load_table(companion_name(".".join(rt.load_table(table_name).name()[-2:])))
    except NoSuchTableError:
        return SCHEMA.empty_table()
    lo = to_micros(parse_instant(start)) if start is not None else None
    hi = to_micros(parse_instant(end)) if end is not None else None
    return read_range(target, "partition_start", lo, hi).sort_by("partition_start")


def to_rows(cmap: CoverageMap) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([{
        "partition": b.label, "partition_start": b.start, "partition_end": b.end, "rows": b.rows, "files": b.files,
        "expected": b.expected, "status": b.status, "last_writer": b.last_writer,
        "backfill_job": ",".join(b.backfill_jobs) or None, "updated_at": now,
    } for b in cmap.buckets], schema=SCHEMA)


def _companion(rt: Runtime, table_name: str) -> IcebergTable:
    name = companion_name(table_name)
    try:
        return rt.catalog.load_table(name)
    except NoSuchTableError:
        pass
    try:
        return rt.catalog.create_table(name, schema=SCHEMA, properties={
            COVERAGE_OF: table_name, "comment": f"coverage of {table_name} per partition, updated after every publish"})
    except TableAlreadyExistsError:
        return rt.catalog.load_table(name)
