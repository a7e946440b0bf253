"""Canary: write, stage and validate one day of a planned job, then wait for a person's decision.

"Run one day first: if that day is wrong, the other 364 will be wrong the same way." The whole job
is planned and leased, but only the units whose partition holds the canary day are written and
staged on the branch; the checks run over that day alone, and the job stops in phase
``awaiting-approval`` with a report a person can judge (counts and checks, sample rows through the
mapping, column statistics, what the day changes on main (its diff, `timelake.steps.diff`),
projections for the whole job). ``approve`` lets the job go on: the
canary's snapshot stays at the branch head, where it keeps its files safe from other engines' cleanup
while the other units are written, and the stage step commits the rest on top of it (the canary's
files are never rewritten); ``abort`` is the ordinary abort.
"""

from __future__ import annotations

import time
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from timelake.errors import Aborted, BackfillError, InvalidJob
from timelake.model.diff import plain
from timelake.model.layout import read_range
from timelake.model.report import AWAITING, approval_deadline
from timelake.model.spec import JobSpec
from timelake.model.timeutil import US_PER_DAY, iso, iso_seconds, to_micros
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobRecord, JobState, Phase, UnitRecord
from timelake.sources.base import SourceBatch
from timelake.steps import diff, spill
from timelake.steps.abort import abort
from timelake.steps.plan import context, job_table
from timelake.steps.scan import mapper_for, open_job_source, read_result
from timelake.steps.stage import stage_files
from timelake.steps.validate import conclude, run_checks
from timelake.steps.write import existing_mask

STEP = "stage-canary"
SAMPLES = 5
SAMPLES_WITH_EXISTING = 2
CANDIDATE_ROWS = 200  # mapped rows of the day looked at to pick the samples


def wanted(job: JobRecord) -> bool:
    """Whether the job asked for a canary that has not been approved yet (a dry run writes no day first:
    it predicts all of them)."""
    return bool(job.spec.get("canary")) and not job.state.get("canary_approved") and not job.spec.get("dry_run")


def select(rt: Runtime, job_id: str) -> list[str]:
    """The canary's units (chosen once, then read back): those whose partition overlaps the day."""
    job = rt.store.get_job(job_id)
    if "canary" in job.state:
        return job.state["canary"]["units"]
    spec = JobSpec.model_validate(job.spec)
    days = _source_days(rt, job)
    if isinstance(spec.canary, date):
        day: int | None = _day_number(spec.canary)
    else:  # True (a job without a canary never gets here): the first day with rows
        day = min(days) if days else None
    if day not in days:
        abort(rt, job_id)  # the lease and the branch were taken by the cut; a job that cannot run holds neither
        message = (f"canary day {_day_text(day)} has no source rows in the job (rows from {_day_text(min(days))} "
                   f"to {_day_text(max(days))}); pick a day with rows, or --canary without a day for the first one"
                   if days and day is not None else "no source rows in scope, so there is no day to run as a canary")
        rt.store.update_job(job_id, error=message)
        raise Aborted(f"job {job_id}: {message}; the job was aborted, main is untouched")
    start, end = day * US_PER_DAY, (day + 1) * US_PER_DAY
    units = [u for u in rt.store.units(job_id) if u.info["start"] < end and u.info["end"] > start]
    chosen = {"day": _day_text(day), "start": min(u.info["start"] for u in units), "end": max(u.info["end"] for u in units),
              "units": [u.unit_id for u in units]}
    rt.store.update_job(job_id, canary=chosen)
    return chosen["units"]


def check(rt: Runtime, job_id: str, source: Any = None) -> dict[str, Any]:
    """Canary step, after its units are written: stage them, validate that day, build the report, wait.
    Raises ValidationFailed like the validate step when a blocking check fails."""
    job = rt.store.get_job(job_id)
    chosen = job.state["canary"]
    units = [rt.store.unit(job_id, u) for u in chosen["units"]]
    missing = [u.unit_id for u in units if u.status != "done"]
    if missing:
        raise BackfillError(f"job {job_id}: {len(missing)} canary unit(s) not written yet (first: {missing[0]}); resume the job")
    table = job_table(rt, job)
    written = [u.result for u in units if u.result.get("path")]
    snapshot_id = stage_files(table, job_id, job.state["branch"], written, STEP, objects=rt.objects)
    scoped = _day_state(job.state, units, snapshot_id)
    checks = run_checks(rt, job.spec, units, scoped)
    conclude(rt, job_id, checks, Phase.WRITING, job.state["branch"])
    changed = diff.conclude(rt, job_id, "canary", units, (chosen["start"], chosen["end"]))
    job = rt.store.get_job(job_id)
    report = build(rt, job, units, snapshot_id, source)
    if changed is not None:  # what the day changes on main, before anyone approves it
        report["diff"] = changed
    rt.store.update_job(job_id, AWAITING, canary_report=report, canary_snapshot_id=snapshot_id,
                        awaiting_since=time.time())
    return {"job_id": job_id, "phase": AWAITING, "day": chosen["day"], "passed": True}


def approve(rt: Runtime, job_id: str, in_time: bool = False) -> dict[str, Any]:
    """Accept the canary: the job continues with the other units, which the stage step commits on top of
    the canary's snapshot. Nothing in the table changes here, so neither another engine's expiry of the
    plan's snapshot nor main moving on can stand in the way.

    ``in_time``: an approval after the deadline aborts the job instead. Embedded, nothing else
    watches the clock; on AWS the workflow's own timeout aborts the job, and its approve step only
    ever follows a decision that came in time, however late the step itself runs."""
    job = rt.store.get_job(job_id)
    if job.state.get("canary_approved"):
        return {"job_id": job_id, "phase": job.phase, "approved": True}
    if job.phase != AWAITING:
        raise BackfillError(f"job {job_id} is {job.phase}, not {AWAITING}: there is no canary to approve")
    spec = JobSpec.model_validate(job.spec)
    deadline = approval_deadline(job)
    if in_time and deadline is not None and time.time() > deadline:
        reject(rt, job_id, "States.Timeout")
        raise Aborted(f"job {job_id}: the canary waited since {iso_seconds(job.state['awaiting_since'])} and its "
                      f"approval ran out at {iso_seconds(deadline)} (approval_timeout_seconds="
                      f"{spec.approval_timeout_seconds}); the job was aborted, main is untouched")
    rt.store.update_job(job_id, Phase.WRITING, canary_approved=True, approved_at=time.time(),
                        approval_token=None)
    return {"job_id": job_id, "phase": Phase.WRITING, "approved": True}


def await_decision(rt: Runtime, job_id: str, token: str) -> dict[str, Any]:
    """Keep the workflow's task token on the job, where the API and the CLI find it to approve or reject."""
    job = rt.store.get_job(job_id)
    if job.phase != AWAITING:
        raise BackfillError(f"job {job_id} is {job.phase}, not {AWAITING}")
    rt.store.update_job(job_id, approval_token=token)
    return {"job_id": job_id, "phase": AWAITING}


def reject(rt: Runtime, job_id: str, reason: str | None) -> dict[str, str]:
    """The canary was rejected, or nobody decided in time: drop the job (branch, files, lease).
    Returns the error and cause the workflow ends with."""
    timed_out = reason == "States.Timeout"
    abort(rt, job_id)
    why = "nobody approved the canary in time" if timed_out else "the canary was rejected"
    rt.store.update_job(job_id, approval_token=None, error=f"{why}; the job was aborted, main is untouched")
    return {"error": "ApprovalTimedOut" if timed_out else "CanaryRejected", "cause": f"job {job_id}: {why}; aborted"}


def build(rt: Runtime, job: JobRecord, units: list[UnitRecord], snapshot_id: int | None, source: Any = None) -> dict[str, Any]:
    """The canary report: what a person needs to judge the day before the rest runs."""
    spec = JobSpec.model_validate(job.spec)
    table = job_table(rt, job)
    state, chosen = job.state, job.state["canary"]
    results = [u.result for u in units]
    rows_in = sum(r.get("rows_in", 0) for r in results)
    written = sum(r.get("rows_written", 0) for r in results)
    seconds = sum(r.get("seconds", 0.0) for r in results)
    samples = _samples(rt, job, spec, table, source)
    return {
        "day": chosen["day"],
        "range": {"start": iso(chosen["start"]), "end": iso(chosen["end"])},
        "units": len(units),
        "files": sum(1 for r in results if r.get("path")),
        "rows_in_source": rows_in,
        "rows_written": written,
        "rows_duplicate_in_source": sum(r.get("rows_duplicate_in_source", 0) for r in results),
        "rows_conflicting_existing": sum(r.get("rows_conflicting_existing", 0) for r in results),
        "bytes_written": sum(r.get("bytes", 0) for r in results),
        "staged_snapshot_id": snapshot_id,
        "checks": [{k: c[k] for k in ("name", "passed", "detail", "blocking")} for c in state.get("checks", [])],
        **_rejects(state, chosen, samples["rejected"]),
        "samples": samples["rows"],
        "columns": _column_stats(table, units, objects=rt.objects),
        "projected": _projected(state, rows_in, written, seconds, len(rt.store.units(job.job_id))),
    }


def _rejects(state: JobState, chosen: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The day's rows left out or nulled (those whose time could be read; the scan counted them per UTC
    day), with examples, beside the whole job's count against its budget: shown first, a day that looks
    right while rows are missing is the case a canary exists for."""
    day = str(_day_number(chosen["day"]))
    return {"rows_rejected_on_day": state.get("issue_days", {}).get(day, 0), "rejected_samples": samples,
            "reject_budget": state.get("reject_budget")}


def _source_days(rt: Runtime, job: JobRecord) -> dict[int, int]:
    """In-scope source rows per UTC day, from the scans' results (no data read)."""
    days: dict[int, int] = {}
    for piece in range(len(job.state["scan_tasks"])):
        result = read_result(rt, job.job_id, piece)
        for day, rows in (result.days.items() if result else ()):
            if rows:
                days[day] = days.get(day, 0) + rows
    return days


def _day_number(day: date | str) -> int:
    value = day if isinstance(day, date) else date.fromisoformat(str(day))
    return to_micros(datetime(value.year, value.month, value.day, tzinfo=UTC)) // US_PER_DAY


def _day_text(day: int) -> str:
    return iso(day * US_PER_DAY)[:10]


def _day_state(state: JobState, units: list[UnitRecord], snapshot_id: int | None) -> JobState:
    """The job's state narrowed to the canary's units: the row balance is over the rows those units
    read (rejections and out-of-range rows belong to the whole source, not to one day)."""
    partitions = {u.info["partition"] for u in units}
    return {
        **state,
        "rows_in_source": sum(u.result.get("rows_in", 0) for u in units),
        "rows_rejected": {}, "rows_outside_range": 0, "rows_outside_retention": 0,
        "range_start": max(state["range_start"], min(u.info["start"] for u in units)),
        "range_end": min(state["range_end"], max(u.info["end"] for u in units)),
        "partition_sums": {p: s for p, s in state["partition_sums"].items() if p in partitions},
        "staged_snapshot_id": snapshot_id,
    }


def _samples(rt: Runtime, job: JobRecord, spec: JobSpec, table: Any, source: Any) -> dict[str, list[dict[str, Any]]]:
    """A few rows of the day as the source had them, as mapped (UTC), and the row main already holds
    for the same key; rows that meet an existing row are shown first, they are the interesting ones.
    Under ``rejected``, rows of the day the job leaves out, with why: looked for until some are found
    when the scan counted any on the day."""
    chosen = job.state["canary"]
    found: dict[str, list[dict[str, Any]]] = {"rows": [], "rejected": []}
    try:
        src = open_job_source(spec, source, table, job.state.get("source_plan"))
    except InvalidJob:
        return found  # in-memory data of another process: nothing left to show
    ctx = context(spec, table, job.state["planned_at_us"])
    contract = ctx.contract
    mapper = mapper_for(ctx, src)
    candidates: list[tuple[dict[str, Any], dict[str, Any], str]] = []
    rejected: list[dict[str, Any]] = []
    days = range(chosen["start"] // US_PER_DAY, -(-chosen["end"] // US_PER_DAY))
    wants_rejected = any(job.state.get("issue_days", {}).get(str(d)) for d in days)

    def enough() -> bool:
        return len(candidates) >= CANDIDATE_ROWS and (len(rejected) >= SAMPLES or not wants_rejected)

    names = src.pieces()
    for piece, (first, last) in enumerate(job.state["scan_tasks"]):
        result = read_result(rt, job.job_id, piece)
        if result is None or not any(chosen["start"] <= d * US_PER_DAY < chosen["end"] for d in result.days):
            continue
        for name in names[first:last]:
            for batch in src.batches(name):
                kept, left_out = _pairs(mapper, batch, contract.time_column, chosen["start"], chosen["end"])
                candidates += kept[:max(CANDIDATE_ROWS - len(candidates), 0)]
                rejected += left_out[:max(SAMPLES - len(rejected), 0)]
                if enough():
                    break
            if enough():
                break
        if enough():
            break
    found["rejected"] = rejected
    if not candidates:
        return found
    mapped = pa.Table.from_pylist([m for _, m, _ in candidates], schema=table.schema().as_arrow())
    existing = read_range(table, contract.time_column, chosen["start"], chosen["end"])  # main as it is now
    hits = existing_mask(mapped, existing, contract) if existing.num_rows else [False] * len(candidates)
    order = [i for i, hit in enumerate(hits) if hit][:SAMPLES_WITH_EXISTING]
    order += [i for i in range(len(candidates)) if i not in order][: SAMPLES - len(order)]
    by_key = {tuple(plain(r[k]) for k in contract.dedup_key): r for r in existing.to_pylist()} if any(hits) else {}
    for i in order:
        raw, row, origin = candidates[i]
        match = by_key.get(tuple(plain(row[k]) for k in contract.dedup_key))
        found["rows"].append({"origin": origin, "source": _jsonable(raw), "mapped": _jsonable(row),
                              "existing": _jsonable(match) if match else None,
                              "outcome": _outcome(spec.mode, match is not None)})
    return found


def _pairs(mapper: Any, batch: SourceBatch, time_column: str, start: int,
           end: int) -> tuple[list[tuple[dict, dict, str]], list[dict[str, Any]]]:
    """(source row, mapped row, where) for the batch's rows inside [start, end), and the rows there the
    mapper left out (where, source row, why). The mapped rows are the source rows it kept, in order."""
    mapped = mapper.apply(batch)
    times = pc.cast(mapped.times, pa.int64())
    inside = pc.fill_null(pc.and_(pc.greater_equal(times, start), pc.less(times, end)), False).to_numpy(zero_copy_only=False)
    kept = np.ones(batch.data.num_rows, dtype=bool) if mapped.dropped is None else ~mapped.dropped.to_numpy(zero_copy_only=False)
    left_out = []
    for i in np.flatnonzero(inside & ~kept)[:SAMPLES].tolist():
        left_out.append({"origin": batch.where(i), "source": _jsonable(batch.data.slice(i, 1).to_pylist()[0]),
                         "reason": mapped.reasons[i].as_py()})
    source_rows = np.flatnonzero(kept)
    chosen = np.flatnonzero(inside[source_rows])[:CANDIDATE_ROWS]
    at = source_rows[chosen]
    rows = zip(batch.data.take(pa.array(at)).to_pylist(), mapped.table.take(pa.array(chosen)).to_pylist(), at.tolist(), strict=True)
    return [(raw, row, batch.where(i)) for raw, row, i in rows], left_out


def _outcome(mode: str, has_existing: bool) -> str:
    if not has_existing:
        return "new row"
    return {"merge": "dropped: the existing row wins (merge)", "replace": "replaces the existing row (replace)",
            "append": "appended beside the existing row (append)"}[mode]


def _column_stats(table: Any, units: list[UnitRecord], *, objects: ObjectIO) -> list[dict[str, Any]]:
    """Per column, min/max/nulls of the day's mapped source rows (its spill) beside the staged files'
    (their Parquet footers); the difference is the duplicates and conflicts the units dropped."""
    schema = table.schema().as_arrow()
    source = {name: _Stats() for name in schema.names}
    partitions: dict[tuple[int, int], set[str]] = {}
    for u in units:
        partitions.setdefault((u.info["spec_id"], u.info["value"]), set()).update(u.info["spill"])
    for partition, paths in sorted(partitions.items()):
        for rows in spill.read(sorted(paths), partition, None, objects=objects):
            for name in schema.names:
                column = rows.column(name)
                source[name].add_values(column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column)
    staged = {name: _Stats() for name in schema.names}
    for u in units:
        if not u.result.get("path"):
            continue
        fs, local = objects.filesystem(u.result["path"])
        with fs.open_input_file(local) as handle:
            metadata = pq.read_metadata(handle)
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema in staged:
                    staged[column.path_in_schema].add_footer(column.statistics, column.num_values)
    return [{"column": name, "source": source[name].to_json(), "staged": staged[name].to_json()} for name in schema.names]


class _Stats:
    def __init__(self) -> None:
        self.rows, self.nulls, self.min, self.max = 0, 0, None, None

    def add_values(self, values: pa.Array) -> None:
        self.rows += len(values)
        self.nulls += values.null_count
        if values.null_count < len(values) and not pa.types.is_nested(values.type):
            bounds = pc.min_max(values)
            self._widen(bounds["min"].as_py(), bounds["max"].as_py())

    def add_footer(self, stats: Any, values: int) -> None:
        self.rows += values
        if stats is None:
            return
        self.nulls += stats.null_count or 0
        if stats.has_min_max:
            self._widen(stats.min, stats.max)

    def _widen(self, lo: Any, hi: Any) -> None:
        self.min = lo if self.min is None or lo < self.min else self.min
        self.max = hi if self.max is None or hi > self.max else self.max

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "nulls": self.nulls, "min": plain(self.min), "max": plain(self.max)}


def _projected(state: JobState, rows_in: int, written: int, seconds: float, units: int) -> dict[str, Any]:
    """The whole job, from the plan's counts and the canary's measured keep rate and write speed."""
    total = state.get("rows_in_scope", 0)
    rate = rows_in / seconds if seconds > 0 else None
    return {
        "rows_in_scope": total,
        "rows_written": round(total * written / rows_in) if rows_in else 0,
        "units": units,
        "files": units,
        "canary_rows_per_second": round(rate) if rate else None,
        "write_seconds_one_worker": round(total / rate, 1) if rate else None,
        "estimated_cost": state.get("estimated_cost"),
    }


def _jsonable(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {k: plain(v) for k, v in row.items()}
