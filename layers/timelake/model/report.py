"""The job report: one JSON-able dict, the same for a dry run, a running job and a finished one."""

from __future__ import annotations

import os
import time
from typing import Any

from timelake.model.limits import limits
from timelake.model.spec import JobSpec
from timelake.model.timeutil import iso, iso_seconds
from timelake.ports.store import JobRecord, UnitRecord

AWAITING = "awaiting-approval"  # the phase of a job whose canary waits for a decision


def progress(job: JobRecord, units: list[UnitRecord]) -> dict[str, Any]:
    """Units done/total, rows, throughput and ETA, from unit records alone (cheap enough to poll)."""
    done = [u for u in units if u.status == "done"]
    rows = sum(u.result.get("rows_in", 0) for u in done)
    total_rows = job.state.get("rows_in_scope", 0)
    started = job.state.get("write_started_at")
    elapsed = (time.time() - started) if started else 0.0
    if job.state.get("write_finished_at") and started:
        elapsed = job.state["write_finished_at"] - started
    throughput = rows / elapsed if elapsed > 0 else None
    remaining = max(total_rows - rows, 0)
    return {
        "job_id": job.job_id,
        "table": job.table,
        "phase": job.phase,
        "units_done": len(done),
        "units_total": len(units) or job.state.get("units_total", 0),
        "rows_processed": rows,
        "rows_total": total_rows,
        "rows_per_second": round(throughput) if throughput else None,
        "eta_seconds": round(remaining / throughput, 1) if throughput and remaining else (0.0 if units and len(done) == len(units) else None),
        "error": job.state.get("error"),
    }


def approval_deadline(job: JobRecord) -> float | None:
    """When a waiting canary's time for a decision runs out (epoch seconds); None unless it waits."""
    if job.phase != AWAITING or "awaiting_since" not in job.state:
        return None
    return job.state["awaiting_since"] + JobSpec.model_validate(job.spec).approval_timeout_seconds


def build_report(job: JobRecord, units: list[UnitRecord]) -> dict[str, Any]:
    s = job.state
    late = s.get("publish_conflicts", {"rows": 0})
    written = sum(u.result.get("rows_written", 0) for u in units) - late["rows"]
    conflicts = sum(u.result.get("rows_conflicting_existing", 0) for u in units) + late["rows"]
    rejected = dict(s.get("rows_rejected", {}))
    report = {
        "job_id": job.job_id,
        "table": job.table,
        "mode": job.spec.get("mode"),
        "phase": job.phase,
        "dry_run": job.spec.get("dry_run", False),
        "source": s.get("source_uri", job.spec.get("source")),
        "source_fingerprint": s.get("source_fingerprint"),
        "rows_in_source": s.get("rows_in_source"),
        "rows_in_scope": s.get("rows_in_scope"),
        "rows_written": written if units else 0,
        "rows_duplicate_in_source": (sum(u.result.get("rows_duplicate_in_source", 0) for u in units) if units
                                     else s.get("rows_duplicate_in_source", 0)),
        "rows_conflicting_existing": conflicts,
        "rows_conflicting_at_publish": late["rows"],
        "rows_outside_retention": s.get("rows_outside_retention", 0),
        "rows_outside_range": s.get("rows_outside_range", 0),
        "rows_rejected": {"total": sum(rejected.values()), "reasons": rejected, "examples": s.get("rejected_examples", {})},
        "time_range": s.get("time_range"),
        "job_range": {"start": _iso(s.get("range_start")), "end": _iso(s.get("range_end"))},
        "units": len(units) or s.get("units_total", 0),
        "files": sum(1 for u in units if u.result.get("path")),
        "bytes_written": sum(u.result.get("bytes", 0) for u in units),
        "overlap_existing_rows": s.get("overlap_existing_rows", conflicts),
        "rows_replaced": s.get("rows_replaced", 0),  # replace mode: rows of main's range the job took over
        "rows_existing_in_range": s.get("rows_existing_in_range"),
        "estimated_cost": s.get("estimated_cost"),
        "source_gaps": s.get("source_gaps", []),
        "checks": s.get("checks", []),
        "published_snapshot_ids": [i for ids in s.get("published_chunks", {}).values() for i in ids],
        "published_chunks": sorted(s.get("published_chunks", {})),
        "columns_filled_with_null": s.get("columns_filled_with_null", []),
        "ignored_source_columns": s.get("ignored_source_columns", []),
        "error": s.get("error"),
        "dst_policy": job.spec.get("dst_policy"),
        "would_fail": s.get("would_fail"),  # dry run: why the run would fail, with the flag that fixes it
        "canary": s.get("canary_report"),
        "approval_deadline": _deadline(job),
        "source_limits": source_limits(job),
        "progress": progress(job, units),
    }
    return report


def source_limits(job: JobRecord) -> dict[str, Any]:
    """The job's source connection and rate limits, with how long reading the source takes under them."""
    spec = JobSpec.model_validate(dict(job.spec))  # a copy: validation normalizes start/end in place
    return limits(spec).to_json(job.state.get("rows_in_source"), spec.max_concurrency or os.cpu_count() or 1)


def _deadline(job: JobRecord) -> str | None:
    return iso_seconds(approval_deadline(job))


def _iso(micros: int | None) -> str | None:
    return iso(micros)
