"""The embedded runner: the steps in order, the write fan-out on a process pool, resumable anywhere.

The phase recorded in the job store says which step runs next, so ``resume`` (after a crash, a
failure or Ctrl-C) simply continues from there; every step is idempotent.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from .errors import BackfillError, Interrupted
from .faults import checkpoint
from .plan import plan
from .publish import publish
from .runtime import Runtime, runtime_for
from .spec import JobSpec
from .stage import stage
from .validate import validate
from .write import write_unit

Progress = Callable[[dict[str, Any]], None]

NEXT_STEP = {
    "created": "plan", "planning": "plan",
    "planned": "write", "writing": "write",
    "written": "stage",
    "staged": "validate",
    "validated": "publish", "publishing": "publish",
}
TERMINAL = {"published", "dry_run_complete", "failed_validation", "aborted"}
IN_PROCESS_ROWS = 300_000


def run_job(
    rt: Runtime, job_id: str, source: Any = None, on_progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> str:
    """Run a job from its current phase to the end; returns the final phase."""
    job = rt.store.get_job(job_id)
    if job.phase == "failed":
        job = rt.store.update_job(job_id, job.state.get("failed_phase", "created"), error=None)
    while job.phase not in TERMINAL:
        step = NEXT_STEP[job.phase]
        if cancel is not None and cancel.is_set():
            raise Interrupted(f"job {job_id} interrupted before {step}; resume with: timelake backfill resume {job_id}")
        try:
            if step == "plan":
                rt.store.update_job(job_id, "planning")
                plan(rt, job_id, source)
                checkpoint("plan.done")
            elif step == "write":
                _write_all(rt, job_id, on_progress, cancel)
            elif step == "stage":
                stage(rt, job_id)
                checkpoint("stage.done")
            elif step == "validate":
                validate(rt, job_id)
            elif step == "publish":
                publish(rt, job_id)
        except Interrupted:
            raise
        except BackfillError as exc:
            if rt.store.get_job(job_id).phase != "failed_validation":
                rt.store.update_job(job_id, "failed", failed_phase=job.phase, error=str(exc))
            raise
        except Exception as exc:
            rt.store.update_job(job_id, "failed", failed_phase=job.phase, error=f"{type(exc).__name__}: {exc}")
            raise
        job = rt.store.get_job(job_id)
    return job.phase


def _write_all(rt: Runtime, job_id: str, on_progress: Progress | None, cancel: threading.Event | None) -> None:
    job = rt.store.update_job(job_id, "writing")
    if "write_started_at" not in job.state:
        job = rt.store.update_job(job_id, write_started_at=time.time())
    spec = JobSpec.model_validate(job.spec)
    units = rt.store.units(job_id)
    pending = [u.unit_id for u in units if u.status != "done"]
    workers = min(spec.max_concurrency or os.cpu_count() or 1, len(pending)) if pending else 0
    tick = _Ticker(rt, job_id, on_progress)
    tick()
    if workers <= 1 or job.state.get("rows_in_scope", 0) < IN_PROCESS_ROWS:
        for unit_id in pending:
            if cancel is not None and cancel.is_set():
                raise Interrupted(f"job {job_id} interrupted while writing; resume with: timelake backfill resume {job_id}")
            write_unit(rt, job_id, unit_id)
            tick()
            checkpoint("write.unit")
    else:
        _fan_out(rt, job_id, pending, workers, tick, cancel)
    rt.store.update_job(job_id, "written", write_finished_at=time.time())


def _fan_out(
    rt: Runtime, job_id: str, pending: list[str], workers: int, tick: Callable[[], None],
    cancel: threading.Event | None,
) -> None:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["timelake.write"])
    config = rt.config.model_dump()
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        queue = list(reversed(pending))
        running: dict[Future, str] = {}
        try:
            while queue or running:
                while queue and len(running) < workers * 2:
                    unit_id = queue.pop()
                    running[pool.submit(_write_in_worker, config, job_id, unit_id)] = unit_id
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    unit_id = running.pop(future)
                    try:
                        future.result()
                    except Exception as exc:
                        raise BackfillError(f"job {job_id}: unit {unit_id} failed: {exc}") from exc
                    tick()
                    checkpoint("write.unit")
                if cancel is not None and cancel.is_set():
                    raise Interrupted(f"job {job_id} interrupted while writing; resume with: timelake backfill resume {job_id}")
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _write_in_worker(config: dict[str, Any], job_id: str, unit_id: str) -> dict[str, Any]:
    return write_unit(runtime_for(config), job_id, unit_id)


class _Ticker:
    def __init__(self, rt: Runtime, job_id: str, on_progress: Progress | None) -> None:
        self.rt, self.job_id, self.on_progress = rt, job_id, on_progress

    def __call__(self) -> None:
        if self.on_progress is not None:
            from .report import progress

            self.on_progress(progress(self.rt.store.get_job(self.job_id), self.rt.store.units(self.job_id)))
