"""The job report: one JSON-able dict, the same for a dry run, a running job and a finished one."""

from __future__ import annotations

import os
import time
from typing import Any

from timelake.model.issues import Issues
from timelake.model.limits import limits
from timelake.model.spec import SETTINGS, JobSpec, current_setting, current_spec
from timelake.model.timeutil import iso, iso_seconds
from timelake.model.window import PAUSED_UNTIL, PAUSES, iso_local, paused_seconds, window_of
from timelake.ports.store import JobRecord, JobStore, Phase, UnitRecord

AWAITING = Phase.AWAITING_APPROVAL  # the phase of a job whose canary waits for a decision


#: The step that runs while a job is in each phase: a phase names the step done last, so this is what
#: `resume` runs next, and whose clock runs while the job sits in the phase.
NEXT_STEP = {
    Phase.CREATED: "plan", Phase.PLANNING: "plan",
    Phase.SCANNING: "scan",
    Phase.SCANNED: "cut",
    Phase.PLANNED: "write", Phase.WRITING: "write",
    Phase.WRITTEN: "stage",
    Phase.STAGED: "validate",
    Phase.VALIDATED: "publish", Phase.PUBLISHING: "publish",
    Phase.REFRESHING: "refresh",
}
STEPS = ("plan", "scan", "cut", "write", "stage", "validate", "publish", "refresh")
INTERRUPTED = "interrupted"  # what status shows for a job whose runner died or was stopped
NOTE_SECONDS = 1.0  # a worker notes its counts in the job store at most this often


def progress_of(store: JobStore, job_id: str) -> dict[str, Any]:
    """`progress` with all the store knows: the steps' notes, and whether a process runs the job."""
    return progress(store.get_job(job_id), store.units(job_id), store.progress_notes(job_id), store.running(job_id))


def report_of(store: JobStore, job_id: str) -> dict[str, Any]:
    return build_report(store.get_job(job_id), store.units(job_id), store.progress_notes(job_id), store.running(job_id))


def progress(job: JobRecord, units: list[UnitRecord], notes: dict[str, dict[str, Any]] | None = None,
             running: bool | None = None, now: float | None = None) -> dict[str, Any]:
    """Where a job is, from the store alone (cheap enough to poll): units and rows written, and each step
    so far with its own count, rows/s, elapsed time and, for the running step, an ETA.

    ``notes``: the store's progress notes (`JobStore.progress_notes`). ``running``: whether a process
    runs the job (`JobStore.running`); False for a job in a working phase means its runner died or was
    stopped, shown as phase ``interrupted`` with no ETA. None: unknown (AWS, where the execution says)."""
    now = time.time() if now is None else now
    notes = notes or {}
    done = [u for u in units if u.status == "done"]
    rows = sum(u.result.get("rows_in", 0) for u in done)
    total_rows = job.state.get("rows_in_scope", 0)
    stopped = running is False and job.phase in NEXT_STEP
    elapsed = step_seconds(job, now, live=running is not False)
    steps = _steps(job, units, notes, elapsed, stopped)
    current = next((s for s in steps if s["state"] in ("running", INTERRUPTED)), None)
    write = elapsed.get("write", 0.0)
    throughput = rows / write if write > 0 else None
    remaining = max(total_rows - rows, 0)
    eta = round(remaining / throughput, 1) if throughput and remaining else (0.0 if units and len(done) == len(units) else None)
    info = {
        "job_id": job.job_id,
        "table": job.table,
        "phase": INTERRUPTED if stopped else job.phase,
        "units_done": len(done),
        "units_total": len(units) or job.state.get("units_total", 0),
        "rows_processed": rows,
        "rows_total": total_rows,
        "rows_per_second": round(throughput) if throughput else None,
        "eta_seconds": None if stopped or job.phase == AWAITING else eta,
        "error": job.state.get("error"),
        "step": current["name"] if current else None,
        "steps": steps,
        "elapsed_seconds": round(sum(elapsed.values()), 3),
    }
    if stopped:
        info["stopped_in"] = job.phase
        info["resume"] = f"timelake backfill resume {job.job_id}"
    window = window_of(job.spec)
    if window is not None:
        info["quiet_hours"] = str(window)
        until = job.state.get(PAUSED_UNTIL)
        waiting = job.phase in NEXT_STEP and not stopped
        info["paused_until"] = iso_local(until, window.tz) if until is not None and waiting else None
    return info


class Tally:
    """One worker's counts for one progress item (a scan task), noted in the job store at most every
    `NOTE_SECONDS` while it runs and once at its end; a reader sums the items of a step."""

    def __init__(self, store: Any, job_id: str, item: str) -> None:
        self.store, self.job_id, self.item = store, job_id, item
        self.counts: dict[str, Any] = {}
        self._noted = time.monotonic()

    def set(self, **counts: Any) -> None:
        self.counts.update(counts)
        if time.monotonic() - self._noted >= NOTE_SECONDS:
            self.close()

    def close(self, **counts: Any) -> None:
        self.counts.update(counts)
        self.store.note_progress(self.job_id, self.item, self.counts)
        self._noted = time.monotonic()


def step_seconds(job: JobRecord, now: float, live: bool = True) -> dict[str, float]:
    """Seconds each step has run, from the phases the store logged: the time a job spends in a phase
    is its next step's. A job run here also keeps its runs (``state["runs"]``: [start, last heartbeat]
    of each process that ran it); time outside them (after a crash, before the resume) counts for no
    step. Waiting for approval or for quiet hours, failed or finished time is no step's either."""
    runs = job.state.get("runs")
    if runs and live:
        runs = [*runs[:-1], [runs[-1][0], now]]
    log = job.phase_log
    seconds: dict[str, float] = {}
    for i, (phase, start) in enumerate(log):
        step = NEXT_STEP.get(phase)
        if step is None:
            continue
        end = log[i + 1][1] if i + 1 < len(log) else now
        spent = sum(max(0.0, min(end, hi) - max(start, lo)) for lo, hi in runs) if runs else max(0.0, end - start)
        seconds[step] = seconds.get(step, 0.0) + max(0.0, spent - paused_seconds(job.state, start, end))
    return seconds


def _steps(job: JobRecord, units: list[UnitRecord], notes: dict[str, dict[str, Any]], elapsed: dict[str, float],
           stopped: bool) -> list[dict[str, Any]]:
    """Every step that has started, in order: its state (done, running, interrupted, failed), its
    count of what it works through, its rows and rate, and an ETA for the running one."""
    s = job.state
    phase = {Phase.FAILED: s.get("failed_phase", job.phase), Phase.FAILED_VALIDATION: Phase.STAGED}.get(job.phase, job.phase)
    current = NEXT_STEP.get(phase)
    order = STEPS.index(current) if current else len(STEPS)
    state = "failed" if job.phase in (Phase.FAILED, Phase.FAILED_VALIDATION) else INTERRUPTED if stopped else "running"
    counts = _counts(job, units, notes)
    steps = []
    for i, name in enumerate(STEPS):
        if i > order or (name not in elapsed and i != order):
            continue
        seconds = elapsed.get(name, 0.0)
        step: dict[str, Any] = {"name": name, "state": state if i == order else "done", "elapsed_seconds": round(seconds, 3),
                "done": None, "total": None, "of": None, "rows": None, "rows_total": None, "rows_per_second": None,
                "eta_seconds": None}
        step.update(counts.get(name, {}))
        if step["rows"] and seconds > 0:
            step["rows_per_second"] = round(step["rows"] / seconds)
        if step["state"] == "running":
            step["eta_seconds"] = _eta(step, seconds)
        steps.append(step)
    return steps


def _counts(job: JobRecord, units: list[UnitRecord], notes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What each step counts: source files (pieces) and rows read, units and rows written, files
    staged, files checked, chunks published, rollup chunks and rule sets refreshed."""
    s = job.state
    tasks = [n for item, n in notes.items() if item.startswith("scan/")]
    pieces = s["scan_tasks"][-1][1] if s.get("scan_tasks") else None
    scanned = sum(n.get("pieces", 0) for n in tasks)
    counts: dict[str, dict[str, Any]] = {
        "scan": {"done": pieces if "rows_in_source" in s else scanned, "total": pieces, "of": "source pieces",
                 "rows": s.get("rows_in_source", sum(n.get("rows", 0) for n in tasks))},
        "write": {"done": sum(1 for u in units if u.status == "done"), "total": len(units) or s.get("units_total"),
                  "of": "units", "rows": sum(u.result.get("rows_in", 0) for u in units if u.status == "done"),
                  "rows_total": s.get("rows_in_scope")},
    }
    if units:
        files = sum(1 for u in units if u.result.get("path"))
        counts["stage"] = {"done": files if "staged_snapshot_id" in s else 0, "total": files, "of": "files"}
    for name, of in (("validate", "files"), ("publish", "chunks"), ("refresh", "steps")):
        note = notes.get(name)
        if note:
            counts[name] = {"done": note.get("done", 0), "total": note.get("total"), "of": note.get("of", of)}
            if "doing" in note:
                counts[name]["doing"] = note["doing"]
    if "publish" in counts:
        counts["publish"]["done"] = len(s.get("published_chunks", {}))
    return counts


def _eta(step: dict[str, Any], seconds: float) -> float | None:
    """Seconds left at the pace so far, from the share of the step's rows (else of its count) done;
    None before any is done."""
    done, total = (step["rows"], step["rows_total"]) if step["rows_total"] else (step["done"], step["total"])
    if not total or not done or seconds <= 0:
        return None
    return round(seconds * max(total - done, 0) / done, 1)


def approval_deadline(job: JobRecord) -> float | None:
    """When a waiting canary's time for a decision runs out (epoch seconds); None unless it waits."""
    if job.phase != AWAITING or "awaiting_since" not in job.state:
        return None
    return job.state["awaiting_since"] + JobSpec.model_validate(job.spec).approval_timeout_seconds


def build_report(job: JobRecord, units: list[UnitRecord], notes: dict[str, dict[str, Any]] | None = None,
                 running: bool | None = None) -> dict[str, Any]:
    s = job.state
    late = s.get("publish_conflicts", {"rows": 0})
    written = sum(u.result.get("rows_written", 0) for u in units) - late["rows"]
    conflicts = sum(u.result.get("rows_conflicting_existing", 0) for u in units) + late["rows"]
    rejected = dict(s.get("rows_rejected", {}))
    issues = Issues.from_json(s.get("value_issues", []))
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
        "rows_rejected": {"total": sum(rejected.values()), "reasons": rejected, "examples": s.get("rejected_examples", {}),
                          "by_column": issues.by_column("rejected")},
        "values_nulled": {"total": issues.rows("nulled"), "by_column": issues.by_column("nulled")},
        "states": {"column": job.spec.get("states_column"), "rows": sum(s.get("states", {}).values()),
                   "counts": s.get("states", {})} if job.spec.get("states_column") else None,
        "reject_budget": s.get("reject_budget"),
        "time_range": s.get("time_range"),
        "job_range": {"start": _iso(s.get("range_start")), "end": _iso(s.get("range_end"))},
        "units": len(units) or s.get("units_total", 0),
        "files": sum(1 for u in units if u.result.get("path")),
        "bytes_written": sum(u.result.get("bytes", 0) for u in units),
        "overlap_existing_rows": s.get("overlap_existing_rows", conflicts),
        "reason": job.spec.get("reason"),
        "diff": s.get("diff_job"),  # replace and merge: what the job changes in its range (totals, per column)
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
        "quiet_hours": quiet_hours(job),
        "settings": {name: current_setting(job, name) for name in SETTINGS},
        "settings_changes": s.get("settings_log", []),
        "progress": progress(job, units, notes, running),
    }
    report["elapsed_seconds"] = report["progress"]["elapsed_seconds"]
    report["steps"] = report["progress"]["steps"]
    return report


def source_limits(job: JobRecord) -> dict[str, Any]:
    """The job's source connection and rate limits, with how long reading the source takes under them."""
    spec = current_spec(job.spec, job.state)
    return limits(spec).to_json(job.state.get("rows_in_source"), spec.max_concurrency or os.cpu_count() or 1)


def quiet_hours(job: JobRecord) -> dict[str, Any] | None:
    """The job's window, the pause it is in (if any) and how long it paused in all; None without one."""
    window = window_of(job.spec)
    if window is None:
        return None
    pauses = job.state.get(PAUSES, [])
    until = job.state.get(PAUSED_UNTIL)
    return {"window": str(window), "paused_until": iso_local(until, window.tz) if until is not None else None,
            "pauses": len(pauses),
            "paused_seconds": round(sum(b - a for a, b in pauses if b is not None), 3)}


def _deadline(job: JobRecord) -> str | None:
    return iso_seconds(approval_deadline(job))


def _iso(micros: int | None) -> str | None:
    return iso(micros)
