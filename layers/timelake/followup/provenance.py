"""Provenance: what was backfilled, when and how, kept where any Iceberg reader finds it.

Every published job adds one row to the Iceberg table ``timelake.backfills`` in the same catalog
(queryable like any table), and every publish commit carries the same facts in its snapshot summary,
so the table's own history explains itself even without the provenance table.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pyarrow as pa
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import EqualTo, Reference
from pyiceberg.expressions.literals import literal

from timelake.model.commit import swap, with_retry
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobRecord, UnitRecord

NAMESPACE = "timelake"
TABLE = f"{NAMESPACE}.backfills"
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([
    pa.field("job_id", pa.string(), nullable=False),
    pa.field("table_name", pa.string(), nullable=False),
    pa.field("mode", pa.string(), nullable=False),
    pa.field("range_start", TS, nullable=False),
    pa.field("range_end", TS, nullable=False),
    pa.field("published_at", TS, nullable=False),
    pa.field("source_uri", pa.string()),
    pa.field("source_fingerprint", pa.string()),
    pa.field("job_json", pa.string(), nullable=False),
    pa.field("job_hash", pa.string(), nullable=False),
    pa.field("engine_version", pa.string(), nullable=False),
    pa.field("rows_in_source", pa.int64()),
    pa.field("rows_written", pa.int64()),
    pa.field("rows_duplicate_in_source", pa.int64()),
    pa.field("rows_conflicting_existing", pa.int64()),
    pa.field("rows_rejected", pa.int64()),
    pa.field("rows_outside_retention", pa.int64()),
    pa.field("rows_outside_range", pa.int64()),
    pa.field("chunks", pa.int32()),
    pa.field("snapshot_ids", pa.list_(pa.int64())),
    pa.field("reason", pa.string()),
    pa.field("diff_rows_before", pa.int64()),
    pa.field("diff_rows_after", pa.int64()),
    pa.field("diff_only_before", pa.int64()),
    pa.field("diff_only_after", pa.int64()),
    pa.field("diff_in_both", pa.int64()),
    pa.field("diff_changed", pa.int64()),
    pa.field("diff", pa.string()),
])
DIFF_TOTALS = ("rows_before", "rows_after", "only_before", "only_after", "in_both", "changed")
SAMPLES_KEPT = 20  # sample rows of each kind the row keeps


def job_hash(spec: dict[str, Any]) -> str:
    """Hash of the job definition without its id: two runs of the same job JSON share it."""
    body = {k: v for k, v in spec.items() if k != "job_id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def engine_version() -> str:
    from timelake.model.version import __version__

    return __version__


def summary_properties(job: JobRecord) -> dict[str, str]:
    """Facts every publish commit carries in its snapshot summary: how the job ran, why (its reason),
    and what it changed in its range (its diff's totals)."""
    properties = {
        "timelake.mode": job.spec["mode"],
        "timelake.source": job.state.get("source_uri") or job.spec["source"],
        "timelake.source-fingerprint": job.state.get("source_fingerprint") or "",
        "timelake.job-hash": job_hash(job.spec),
        "timelake.engine-version": engine_version(),
    }
    if job.spec.get("reason"):
        properties["timelake.reason"] = job.spec["reason"]
    totals = (job.state.get("diff_job") or {}).get("totals")
    if totals:
        properties.update({f"timelake.diff.{name.replace('_', '-')}": str(totals[name]) for name in DIFF_TOTALS})
    return properties


def record(rt: Runtime, job: JobRecord, units: list[UnitRecord], diff: dict[str, Any] | None = None) -> None:
    """Add the job's row to ``timelake.backfills`` once (a resume finds it and adds nothing), with its
    reason and, for a job with a diff, its totals and its summary (per column, per day, the most changed
    series and sample rows side by side) as JSON, so the explanation stays with the table whatever
    becomes of the job's scratch files."""
    from timelake.model.report import build_report

    table = _table(rt)
    if table.scan(row_filter=EqualTo(term=Reference("job_id"), value=literal(job.job_id)), selected_fields=("job_id",)).to_arrow().num_rows:
        return
    report = build_report(job, units)
    row = {
        "job_id": job.job_id, "table_name": job.table, "mode": job.spec["mode"],
        "range_start": job.state["range_start"], "range_end": job.state["range_end"],
        "published_at": int(time.time() * 1_000_000), "source_uri": report["source"],
        "source_fingerprint": report["source_fingerprint"], "job_json": json.dumps(job.spec, sort_keys=True),
        "job_hash": job_hash(job.spec), "engine_version": engine_version(),
        "rows_in_source": report["rows_in_source"], "rows_written": report["rows_written"],
        "rows_duplicate_in_source": report["rows_duplicate_in_source"],
        "rows_conflicting_existing": report["rows_conflicting_existing"],
        "rows_rejected": report["rows_rejected"]["total"], "rows_outside_retention": report["rows_outside_retention"],
        "rows_outside_range": report["rows_outside_range"], "chunks": len(report["published_chunks"]),
        "snapshot_ids": report["published_snapshot_ids"], "reason": job.spec.get("reason"),
        "diff": json.dumps(_kept(diff)) if diff else None,
        **{f"diff_{name}": (diff or {}).get("totals", {}).get(name) for name in DIFF_TOTALS},
    }
    rows = pa.Table.from_pylist([row], schema=SCHEMA).cast(table.schema().as_arrow())
    # written and appended as the engine's other companions are (`swap`): pyiceberg's ``append`` checks an
    # Arrow schema against the table's by building a rich table to print, which imported rich into the
    # publish step: 0.025 s of a 30-file job's 0.1 s publish
    swap(table, None, rows, "provenance")


def history(rt: Runtime, table_name: str | None = None) -> pa.Table:
    """Published backfills, oldest first (of one table, or all)."""
    try:
        table = rt.catalog.load_table(TABLE)
    except NoSuchTableError:
        return SCHEMA.empty_table()
    scan = table.scan(row_filter=EqualTo(term=Reference("table_name"), value=literal(table_name))) if table_name else table.scan()
    return scan.to_arrow().sort_by("published_at")


def _table(rt: Runtime) -> Any:
    try:
        return _current(rt.catalog.load_table(TABLE))
    except NoSuchTableError:
        pass
    try:
        if not rt.catalog.namespace_exists(NAMESPACE):  # the AWS stack creates it: no function may CreateDatabase
            rt.catalog.create_namespace(NAMESPACE)
    except NamespaceAlreadyExistsError:
        pass
    try:
        return rt.catalog.create_table(TABLE, schema=SCHEMA, properties={"comment": "one row per published backfill"})
    except TableAlreadyExistsError:
        return rt.catalog.load_table(TABLE)


def _kept(diff: dict[str, Any]) -> dict[str, Any]:
    """The diff as a row keeps it: every day and column, the most changed series, and the first
    `SAMPLES_KEPT` sample rows of each kind (the job's own summary keeps a few a day)."""
    return {**{k: v for k, v in diff.items() if k != "cells"},
            "samples": {kind: rows[:SAMPLES_KEPT] for kind, rows in diff.get("samples", {}).items()}}


def _current(table: Any) -> Any:
    """The provenance table with every column this version records: a table an earlier version created
    gains the new ones (optional, so its older rows read them as null)."""
    missing = [f for f in SCHEMA if f.name not in table.schema().column_names]
    if not missing:
        return table

    def evolve(current: Any) -> Any:
        if all(f.name in current.schema().column_names for f in missing):
            return current
        with current.update_schema() as update:
            update.union_by_name(pa.schema([f.with_nullable(True) for f in missing]))
        return current.refresh()

    return with_retry(table, evolve, "provenance schema")
