"""Plan: read the source once, map it onto the table contract, count everything, cut work units.

The scan also spills the in-scope rows, already mapped and grouped by target partition, to Arrow
IPC files in the job's staging area. Units then read only their own partition's rows, which keeps
the fan-out linear in rows whatever the source's file layout is (day files or one file per device).
A dry run does the same scan, spills nothing and changes nothing.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .contract import Contract
from .cost import estimate_cost
from .errors import DstRefused, InvalidJob
from .layout import PartitionKey, micros, partition_codes, read_range, split_by_code
from .mapping import Mapper
from .runtime import Runtime, filesystem
from .source import open_source
from .spec import JobSpec
from .store import Lease, UnitRecord
from .timeutil import US_PER_DAY, iso, next_boundary, floor_to, subtract_duration, to_micros

MAX_OPEN_SPILLS = 128


@dataclass
class _Partition:
    key: PartitionKey
    rows: int = 0
    nbytes: int = 0
    check_sum: float = 0.0
    spill: list[str] = field(default_factory=list)


@dataclass
class _Scan:
    """Everything the single pass over the source learns."""

    rows_in_source: int = 0
    rejected: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    rows_outside_range: int = 0
    rows_outside_retention: int = 0
    min_us: int | None = None
    max_us: int | None = None
    days: Counter = field(default_factory=Counter)
    partitions: dict[PartitionKey, _Partition] = field(default_factory=dict)
    sample: pa.Table | None = None

    @property
    def rows_in_scope(self) -> int:
        return sum(p.rows for p in self.partitions.values())


class _Spiller:
    """Arrow IPC streams per partition, at most MAX_OPEN_SPILLS open at once (a source spanning years
    touches thousands of partitions; a closed one continues in a new part file)."""

    def __init__(self, rt: Runtime, job_id: str, schema: pa.Schema) -> None:
        self.fs, self.root = filesystem(rt.staging_path(job_id, "spill"))
        self.fs.create_dir(self.root, recursive=True)
        self.schema = schema
        self.open: dict[PartitionKey, tuple[Any, Any]] = {}

    def write(self, part: _Partition, rows: pa.Table) -> None:
        if part.key not in self.open:
            if len(self.open) >= MAX_OPEN_SPILLS:
                self._close(next(iter(self.open)))
            path = f"{self.root}/{part.key.name}-{len(part.spill)}.arrow"
            stream = self.fs.open_output_stream(path)
            self.open[part.key] = (stream, pa.ipc.new_stream(stream, self.schema))
            part.spill.append(path)
        else:
            self.open[part.key] = self.open.pop(part.key)  # most recently used last
        self.open[part.key][1].write_table(rows)

    def _close(self, key: PartitionKey) -> None:
        stream, writer = self.open.pop(key)
        writer.close()
        stream.close()

    def close(self) -> None:
        for key in list(self.open):
            self._close(key)


def plan(rt: Runtime, job_id: str, source: Any = None) -> dict[str, Any]:
    """Plan step. Input: a job id (the job record holds the spec); ``source`` only for in-memory data."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    table = rt.load_table(spec.table)
    contract = Contract.from_table(table)
    if source is None and spec.source.startswith("<"):
        raise InvalidJob(f"job {job_id}: the source was in-memory data ({spec.source}) and is gone; start a new job")
    src = open_source(source if source is not None else spec.source, format=spec.format)
    mapper = Mapper(
        table.schema().as_arrow(), src.schema(), time_column=contract.time_column,
        series_key=list(contract.series_key), column_map=spec.map, tz=spec.tz, time_unit=spec.time_unit,
        dst_policy=spec.dst_policy,
    )
    now = datetime.now(timezone.utc)
    retention_cutoff = (
        to_micros(subtract_duration(now, contract.retention))
        if contract.retention and not spec.override_retention else None
    )
    cutoffs = contract.tier_cutoffs(now)
    start_us = to_micros(spec.start) if spec.start else None
    end_us = to_micros(spec.end) if spec.end else None

    if not spec.dry_run:
        _clear_staging(rt, job_id)
    spiller = None if spec.dry_run else _Spiller(rt, job_id, table.schema().as_arrow())
    overlap = _OverlapCounter(contract) if spec.dry_run else None
    scan = _Scan()
    try:
        for batch in src.batches():
            mapped = mapper.apply(batch)
            scan.rows_in_source += batch.data.num_rows
            scan.rejected.update(mapped.rejected)
            for reason, example in mapped.examples.items():
                scan.examples.setdefault(reason, example)
            if not spec.dry_run and spec.dst_policy == "refuse":
                _refuse_dst(scan)
            _scan_batch(scan, mapped.table, contract, cutoffs, start_us, end_us, retention_cutoff, spiller, overlap)
    finally:
        if spiller:
            spiller.close()

    if scan.rows_in_source == 0:
        raise InvalidJob(f"source '{src.uri}' has no rows")
    range_start, range_end = _job_range(scan, start_us, end_us)
    units = _cut_units(job_id, scan, contract, table)
    state: dict[str, Any] = {
        "source_uri": src.uri,
        "source_fingerprint": src.fingerprint(),
        "rows_in_source": scan.rows_in_source,
        "rows_in_scope": scan.rows_in_scope,
        "rows_rejected": dict(scan.rejected),
        "rejected_examples": scan.examples,
        "rows_outside_range": scan.rows_outside_range,
        "rows_outside_retention": scan.rows_outside_retention,
        "time_range": {"min": iso(scan.min_us), "max": iso(scan.max_us)},
        "range_start": range_start,
        "range_end": range_end,
        "source_gaps": _gaps(scan, range_start, range_end),
        "columns_filled_with_null": getattr(mapper, "filled_with_null", []),
        "ignored_source_columns": getattr(mapper, "ignored_source_columns", []),
        "units_total": len(units),
        "estimated_cost": estimate_cost(scan.rows_in_scope, len(units), spec.max_concurrency),
        "partition_sums": {p.key.name: p.check_sum for p in scan.partitions.values()},
        "check_column": contract.check_column,
    }
    if spec.dry_run:
        assert overlap is not None
        state.update(overlap.finish(table, range_start, range_end))
        rt.store.update_job(job_id, "dry_run_complete", **state)
        return {"job_id": job_id, "dry_run": True, "units": len(units)}
    if spec.dst_policy == "refuse":
        _refuse_dst(scan)

    rt.store.acquire_lease(Lease(spec.table, range_start, range_end, job_id))
    branch = f"backfill/{job_id}"
    base = table.current_snapshot() or _empty_snapshot(table, job_id)
    if table.metadata.refs.get(branch) is None:
        table.manage_snapshots().create_branch(snapshot_id=base.snapshot_id, branch_name=branch).commit()
    state.update(branch=branch, base_snapshot_id=base.snapshot_id)
    rt.store.put_units(job_id, units)
    _write_unit_manifest(rt, job_id, units)
    rt.store.update_job(job_id, "planned", **state)
    return {"job_id": job_id, "dry_run": False, "units": len(units)}


def _scan_batch(
    scan: _Scan, rows: pa.Table, contract: Contract, cutoffs: list[int], start_us: int | None, end_us: int | None,
    retention_cutoff: int | None, spiller: _Spiller | None, overlap: "_OverlapCounter | None",
) -> None:
    if rows.num_rows == 0:
        return
    ts = micros(rows, contract.time_column)
    scan.min_us = int(ts.min()) if scan.min_us is None else min(scan.min_us, int(ts.min()))
    scan.max_us = int(ts.max()) if scan.max_us is None else max(scan.max_us, int(ts.max()))
    keep = np.ones(len(ts), dtype=bool)
    if start_us is not None:
        keep &= ts >= start_us
    if end_us is not None:
        keep &= ts < end_us
    scan.rows_outside_range += int((~keep).sum())
    if retention_cutoff is not None:
        old = keep & (ts < retention_cutoff)
        scan.rows_outside_retention += int(old.sum())
        keep &= ~old
    if not keep.all():
        rows, ts = rows.filter(pa.array(keep)), ts[keep]
    if rows.num_rows == 0:
        return
    days, counts = np.unique(np.floor_divide(ts, US_PER_DAY), return_counts=True)
    scan.days.update(dict(zip(days.tolist(), counts.tolist())))
    if scan.sample is None:
        scan.sample = rows.slice(0, 100_000)
    if overlap is not None:
        overlap.add(rows)
    codes, keys = partition_codes(ts, contract, cutoffs)
    for code, part_rows in split_by_code(rows, codes):
        key = keys[code]
        part = scan.partitions.setdefault(key, _Partition(key))
        part.rows += part_rows.num_rows
        part.nbytes += part_rows.nbytes
        if contract.check_column:
            part.check_sum += float(pc.sum(part_rows.column(contract.check_column)).as_py() or 0)
        if spiller:
            spiller.write(part, part_rows)


def _refuse_dst(scan: _Scan) -> None:
    bad = {r: n for r, n in scan.rejected.items() if r.startswith("dst_") and n}
    if bad:
        detail = "; ".join(f"{n} {r} (e.g. {scan.examples.get(r, '?')})" for r, n in bad.items())
        raise DstRefused(
            f"local times that do not exist or are ambiguous in the source time zone: {detail}; "
            "choose a policy with --dst-policy earliest|latest|drop"
        )


def _empty_snapshot(table: Any, job_id: str) -> Any:
    """Iceberg branches fork from a snapshot; a brand-new table gets an empty one (readers see no rows)."""
    from .commit import JOB_PROPERTY, STEP_PROPERTY

    with table.transaction() as tx:
        tx.update_snapshot(snapshot_properties={JOB_PROPERTY: job_id, STEP_PROPERTY: "fork"}).fast_append().commit()
    return table.refresh().current_snapshot()


def _job_range(scan: _Scan, start_us: int | None, end_us: int | None) -> tuple[int, int]:
    """The leased (and, in replace mode, replaced) range: the job's bounds, else the source's whole days."""
    if scan.min_us is None or scan.max_us is None:
        raise InvalidJob("the source has no rows with a valid time")
    lo = start_us if start_us is not None else floor_to(scan.min_us, "day")
    hi = end_us if end_us is not None else next_boundary(scan.max_us, "day")
    return lo, hi


def _gaps(scan: _Scan, start: int, end: int) -> list[dict[str, Any]]:
    """Runs of whole days in the range with no source rows in scope."""
    gaps: list[dict[str, Any]] = []
    first, last = start // US_PER_DAY, (end - 1) // US_PER_DAY
    day = first
    while day <= last:
        if scan.days.get(day):
            day += 1
            continue
        run = day
        while day <= last and not scan.days.get(day):
            day += 1
        gaps.append({"start": iso(run * US_PER_DAY)[:10], "end": iso((day - 1) * US_PER_DAY)[:10], "days": day - run})
    return gaps


def _bytes_per_row(sample: pa.Table | None, contract: Contract, table: Any) -> float:
    """Parquet bytes per row measured on a sorted sample, so units are sized in file bytes."""
    if sample is None or sample.num_rows == 0:
        return 1.0
    order = [(c, "ascending") for c in (*contract.series_key, contract.time_column)]
    buf = io.BytesIO()
    pq.write_table(sample.sort_by(order), buf, compression=table.properties.get("write.parquet.compression-codec", "zstd"))
    return max(buf.tell() / sample.num_rows, 1e-3)


def _cut_units(job_id: str, scan: _Scan, contract: Contract, table: Any) -> list[UnitRecord]:
    """One unit per partition and series slice; slices per partition chosen so each file is near target."""
    bpr = _bytes_per_row(scan.sample, contract, table)
    units = []
    for part in sorted(scan.partitions.values(), key=lambda p: p.key.range):
        slices = max(1, round(part.rows * bpr / contract.target_file_size)) if contract.series_key else 1
        lo, hi = part.key.range
        for i in range(slices):
            units.append(UnitRecord(
                unit_id=f"{part.key.name}-{i}of{slices}",
                info={
                    "partition": part.key.name, "spec_id": part.key.spec_id, "transform": part.key.transform,
                    "value": part.key.value, "start": lo, "end": hi, "slice": i, "slices": slices,
                    "spill": part.spill, "rows_estimate": math.ceil(part.rows / slices),
                },
            ))
    return units


def _clear_staging(rt: Runtime, job_id: str) -> None:
    fs, root = filesystem(rt.staging_path(job_id))
    try:
        fs.delete_dir(root)
    except FileNotFoundError:
        pass


def _write_unit_manifest(rt: Runtime, job_id: str, units: list[UnitRecord]) -> None:
    """The unit list as a JSON array in object storage: a Distributed Map reads it (no payload limit)."""
    fs, path = filesystem(rt.staging_path(job_id, "units.json"))
    with fs.open_output_stream(path) as out:
        out.write(json.dumps([{"job_id": job_id, "unit_id": u.unit_id} for u in units]).encode())


class _OverlapCounter:
    """Dry run only: how many in-scope source keys already exist on main (DuckDB spills, memory stays bounded)."""

    def __init__(self, contract: Contract) -> None:
        self.keys = list(contract.dedup_key)
        self.time_column = contract.time_column
        self.tmp = tempfile.TemporaryDirectory(prefix="timelake-dry-run-")
        self.con = duckdb.connect(f"{self.tmp.name}/keys.db")
        self.created = False

    def _cols(self) -> str:
        return ", ".join(f'"{k}"' for k in self.keys)

    def add(self, rows: pa.Table) -> None:
        batch = rows.select(self.keys)  # noqa: F841 (read by DuckDB by name)
        verb = "INSERT INTO src SELECT" if self.created else "CREATE TABLE src AS SELECT"
        self.con.execute(f"{verb} {self._cols()} FROM batch")
        self.created = True

    def finish(self, table: Any, start: int, end: int) -> dict[str, int]:
        try:
            if not self.created or table.current_snapshot() is None:
                return {"overlap_existing_rows": 0, "rows_existing_in_range": 0}
            main = read_range(table, self.time_column, start, end, tuple(self.keys))  # noqa: F841
            cols = self._cols()
            overlap = self.con.execute(f"SELECT count(*) FROM src SEMI JOIN main USING ({cols})").fetchone()[0]
            return {"overlap_existing_rows": int(overlap), "rows_existing_in_range": main.num_rows}
        finally:
            self.con.close()
            self.tmp.cleanup()
