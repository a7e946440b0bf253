"""When and how fast a job works once submitted: its quiet hours, and the settings changed while it runs.

Quiet hours (`timelake.model.window`) are asked at every unit boundary by whoever is about to start
work: the embedded runner between steps, units and publish chunks, and on AWS each scan, write and
check Lambda and the publish Lambda. Outside the window the answer is the instant it opens next; the
job notes it (``paused_until``, and the pause in ``pauses``), so status shows "paused until …",
and the first worker back inside the window closes the pause. Paused time counts for no step.

Settings (`SETTINGS`: writers and scan tasks at once, source rows per second) live in the job's state,
over the submitted spec (`current_spec`): the embedded fan-out reads them as units finish, the source
throttle reads the rate beside its budget in the job store, and on AWS the next Map starts with them
(the orchestrator also updates a Map run already running).
"""

from __future__ import annotations

from typing import Any

from timelake.errors import BackfillError
from timelake.model.spec import Settings, current_spec
from timelake.model.window import PAUSED_UNTIL, PAUSES, window_of
from timelake.ports.runtime import Runtime
from timelake.ports.store import TERMINAL, JobRecord, JobState

MAX_PAUSES = 500  # a job that runs for years of nights keeps its latest pauses
ATTEMPTS = 20


class _Changed(Exception):
    """The job changed between the look and the write: look again."""


def closed_until(rt: Runtime, job: JobRecord) -> float | None:
    """For a worker about to start work on ``job``: None to go on (closing the job's pause, if one was
    noted), else the instant its window opens next (noted on the job, once per pause)."""
    window = window_of(job.spec)
    if window is None:
        return None
    now = rt.clock.now()
    if window.contains(now):
        if job.state.get(PAUSED_UNTIL) is not None:
            _note(rt, job.job_id, None, now)
        return None
    until = window.next_open(now)
    if job.state.get(PAUSED_UNTIL) != until:
        _note(rt, job.job_id, until, now)
    return until


def _note(rt: Runtime, job_id: str, until: float | None, now: float) -> None:
    """Start (``until``) or end (None) the job's pause. Workers race to note the same pause: the write
    is conditional on the pause state read, and whoever finds it already noted leaves it."""
    for _ in range(ATTEMPTS):
        seen = rt.store.get_job(job_id).state
        if seen.get(PAUSED_UNTIL) == until:
            return
        pauses = [list(p) for p in seen.get(PAUSES, [])]
        if until is None:
            if pauses and pauses[-1][1] is None:
                pauses[-1][1] = now
        elif not pauses or pauses[-1][1] is not None:
            pauses = [*pauses, [now, None]][-MAX_PAUSES:]

        def unchanged(job: JobRecord, seen: JobState = seen) -> None:
            if job.state.get(PAUSED_UNTIL) != seen.get(PAUSED_UNTIL) or job.state.get(PAUSES) != seen.get(PAUSES):
                raise _Changed

        try:
            state: JobState = {PAUSED_UNTIL: until, PAUSES: pauses}
            rt.store.update_job_if(job_id, unchanged, **state)
            return
        except _Changed:
            continue


def change_settings(rt: Runtime, job_id: str, **given: Any) -> JobRecord:
    """Set a job's writers and scan tasks at once (``max_concurrency``) or its source rate
    (``source_rows_per_second``), from its next unit and its next row reservation on. A finished job
    is refused in one line; a failed or interrupted one takes them when it resumes."""
    wanted = Settings.model_validate({k: v for k, v in given.items() if v is not None}).model_dump(exclude_none=True)
    if not wanted:
        raise ValueError("nothing to set: give max_concurrency and/or source_rows_per_second")
    for _ in range(ATTEMPTS):
        job = rt.store.get_job(job_id)
        _unfinished(job)
        settings = {**job.state.get("settings", {}), **wanted}
        current_spec(job.spec, {"settings": settings})  # the job as it then is must still be a valid job
        if "source_rows_per_second" in wanted:
            rt.store.set_rate(job_id, wanted["source_rows_per_second"])
        log = [*job.state.get("settings_log", []), {"at": rt.clock.now(), **wanted}][-MAX_PAUSES:]

        def unchanged(current: JobRecord, seen: JobState = job.state) -> None:
            _unfinished(current)
            if current.state.get("settings_log") != seen.get("settings_log"):
                raise _Changed

        try:
            return rt.store.update_job_if(job_id, unchanged, settings=settings, settings_log=log)
        except _Changed:
            continue
    raise BackfillError(f"job {job_id}: its settings kept changing under this change; try again")


def _unfinished(job: JobRecord) -> None:
    if job.phase in TERMINAL:
        raise BackfillError(f"job {job.job_id} is {job.phase.replace('_', ' ')}: settings change a job that has not "
                            "finished")
