"""The embedded runner: the steps in order, the write fan-out on a process pool, resumable anywhere.

The phase recorded in the job store says which step runs next, so ``resume`` (after a crash, a
failure or Ctrl-C) simply continues from there; every step is idempotent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from typing import Any

from timelake import memory
from timelake.adapters import runtime_for
from timelake.errors import Aborted, BackfillError, FilesLost, Interrupted
from timelake.followup import refresh as followup
from timelake.model.contract import Contract
from timelake.model.faults import checkpoint
from timelake.model.diff import MainAtPlan
from timelake.model.layout import MainReader
from timelake.model.lineage import planned_view
from timelake.model.limits import limits
from timelake.model.report import NEXT_STEP
from timelake.model.spec import MAX_CONCURRENCY, JobSpec, current_setting, current_spec
from timelake.ports.runtime import Runtime
from timelake.ports.store import TERMINAL, JobRecord, Lease, Phase
from timelake.sources.postgres import is_postgres
from timelake.steps import canary, diff
from timelake.steps.abort import abort
from timelake.steps.plan import cut, pending_pieces, plan, scan, tasks_main
from timelake.steps.publish import publish
from timelake.steps.schedule import closed_until
from timelake.steps.scan import open_job_source
from timelake.steps.spill import coded_columns
from timelake.steps.stage import stage
from timelake.steps.validate import CheckContext, check_file, check_items, early_checks, plan_checks, unchecked, validate
from timelake.steps.write import Writers, write_unit
from timelake.workers import WorkerPool

WAITING = {canary.AWAITING}  # the job stops here until a person approves (continue) or aborts it
# Below this many rows, units are written by threads of this process (a unit's sort, take and
# Parquet encoding run outside the GIL): starting worker processes (each imports the engine: about 1-2 s
# here) costs more than they save. bench/bench_backfill.py, 13M rows on 2 cores: threads 0.77 s,
# processes 0.87 s; from a PostgreSQL source, which starts no processes for its scan, 0.7 s against 1.5 s.
IN_PROCESS_ROWS = ("TIMELAKE_IN_PROCESS_ROWS", 20_000_000)
# At most this many writers are threads whatever the rows: two threads of one process keep two cores
# busy (the GIL is held for a small part of a unit), and processes only add their start and their own
# copies of the engine. bench/bench_backfill.py --days 120, 51.8M rows from a file per device on 2
# cores: the write step 3.5 s on processes, 2.3 s on threads, and the peak memory 793 MB against 654.
THREAD_WRITERS = ("TIMELAKE_THREAD_WRITERS", 2)
# Below this many source bytes (as the pieces report them), scan tasks run on threads too: Arrow
# reads Parquet and CSV and does most of the mapping outside the GIL, and starting processes was
# half of a 13M-row scan (bench/bench_backfill.py, day-ordered: 2.2 s on processes, 1.1 s on threads).
# Above it, processes, so that a long scan on many cores is not held back by the GIL. A PostgreSQL
# source is always read by threads: its driver decodes outside the GIL (bench/bench_postgres.py).
IN_PROCESS_SOURCE_BYTES = ("TIMELAKE_IN_PROCESS_SOURCE_BYTES", 1 << 30)
# (each read from its environment variable when a fan-out starts, so a process can change it between jobs)
# Steps that run whatever the time: planning (it reads listings, footers and schemas, so a wrong job fails at
# once rather than when its quiet hours begin) and the rollups after publish (the table's own follow-up,
# which on AWS its events start). Every other step, and every unit and publish commit, waits for them.
UNGATED = {"plan", "refresh"}
HEARTBEAT_SECONDS = 2.0  # how often a runner notes that it still runs the job: the time a crash loses from its clock
MAX_RUNS = 100


def setting(name_and_default: tuple[str, int]) -> int:
    """A tuning limit: its environment variable as set now, else its default."""
    name, default = name_and_default
    return int(os.environ.get(name, default))


def run_job(rt: Runtime, job_id: str, source: Any = None, cancel: threading.Event | None = None) -> str:
    """Run a job from its current phase to the end; returns the final phase. One process at a time
    runs a job (`JobBusy` otherwise); while it does, the job store shows it as running."""
    record = rt.store.get_job(job_id)  # an unknown job is named as such, before anything is held
    rt.check_catalog(record.spec.get("catalog"))
    memory.tune()
    with memory.frozen(), rt.store.hold(job_id), _Heartbeat(rt, job_id):
        return _run(rt, job_id, source, cancel)


def _run(rt: Runtime, job_id: str, source: Any, cancel: threading.Event | None) -> str:
    job = reopen(rt, job_id)
    while job.phase not in TERMINAL | WAITING:
        step = NEXT_STEP[job.phase]
        if step in UNGATED:
            _check(cancel, job_id, f"before {step}", rt)
        else:
            _in_window(rt, job_id, cancel, f"before {step}")
        try:
            if step == "plan":
                rt.store.update_job(job_id, Phase.PLANNING)
                plan(rt, job_id, source)
            elif step == "scan":
                _scan_all(rt, job_id, source, cancel)
            elif step == "cut":
                cut(rt, job_id)
                checkpoint("plan.done")
            elif step == "write" and canary.wanted(job):
                only = canary.select(rt, job_id)
                chosen = rt.store.get_job(job_id).state["canary"]
                _main_all(rt, job_id, cancel, span=(chosen["start"], chosen["end"]))
                _write_all(rt, job_id, cancel, only=only)
                canary.check(rt, job_id, source)
            elif step == "write":
                _main_all(rt, job_id, cancel)
                _write_all(rt, job_id, cancel)
                if job.spec.get("dry_run"):
                    diff.finish_dry_run(rt, job_id)
            elif step == "stage":
                try:
                    with _checking_beside(rt, job_id):
                        stage(rt, job_id)
                except FilesLost:
                    pass  # the job is back at its write step, with those units pending: the loop writes them
                else:
                    checkpoint("stage.done")
            elif step == "validate":
                _check_all(rt, job_id, cancel)
                validate(rt, job_id)
            elif step == "publish":
                publish(rt, job_id, between=lambda: _in_window(rt, job_id, cancel, "between publish commits"))
                if followup.needed(rt.load_table(job.table), JobSpec.model_validate(job.spec)):
                    rt.store.update_job(job_id, Phase.REFRESHING)
            elif step == "refresh":
                followup.run(rt, job_id)
        except Aborted:
            abort(rt, job_id)
            raise
        except Interrupted:
            raise
        except BackfillError as exc:
            record_failure(rt, job_id, str(exc))
            raise
        except Exception as exc:
            if not _full_disk(exc):
                record_failure(rt, job_id, f"{type(exc).__name__}: {exc}")
                raise
            # the job store may sit on a roomier disk than the staging and warehouse; if not, this
            # write fails too and the job stays in its phase, which resume continues from all the same
            filename = getattr(exc, "filename", None)
            error = (f"job {job_id}: no space left on device{f' ({filename})' if filename else ''} in {step}: "
                     f"make room, then timelake backfill resume {job_id}")
            record_failure(rt, job_id, error)
            raise BackfillError(error) from exc
        job = rt.store.get_job(job_id)
    return job.phase


def _full_disk(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def reopen(rt: Runtime, job_id: str) -> JobRecord:
    """A failed job continues from the phase it failed in, taking its lease again (`LeaseConflict` if
    another job took the range meanwhile); any other job is returned as it is."""
    job = rt.store.get_job(job_id)
    if job.phase == Phase.FAILED:
        if "range_start" in job.state and not job.spec.get("dry_run"):
            rt.store.acquire_lease(Lease(job.table, job.state["range_start"], job.state["range_end"], job_id))
        job = rt.store.update_job(job_id, Phase(job.state.get("failed_phase", Phase.CREATED)), error=None)
    return job


def record_failure(rt: Runtime, job_id: str, error: str) -> JobRecord:
    """Mark a job failed, remembering the phase to resume from (a failed validation or an abort stays as
    it is), and release its lease: a failed job holds no range until it is resumed, so the next job
    on that range is not refused because of it."""
    job = rt.store.get_job(job_id)
    if job.phase in (Phase.FAILED, Phase.FAILED_VALIDATION, Phase.ABORTED):
        return rt.store.update_job(job_id, error=error) if job.phase == Phase.FAILED else job
    rt.store.release_lease(job_id)
    return rt.store.update_job(job_id, Phase.FAILED, failed_phase=job.phase, error=error)


def _scan_all(rt: Runtime, job_id: str, source: Any, cancel: threading.Event | None) -> None:
    """Scan every source piece not scanned yet: in-process for in-memory data or a single piece."""
    job = rt.store.get_job(job_id)
    spec = current_spec(job.spec, job.state)
    pending = pending_pieces(rt, job_id)
    connections = limits(spec).max_connections
    workers = min(_workers(job, connections), len(pending))
    in_process = source is not None or workers <= 1
    threads = in_process or is_postgres(spec.source) or job.state.get("source_bytes", 0) < setting(IN_PROCESS_SOURCE_BYTES)
    main = tasks_main(rt, job_id) if pending and threads else None  # the tasks on this process plan main once
    if in_process:
        src = open_job_source(spec, source, rt.load_table(spec.table), job.state.get("source_plan")) if pending else None
        tasks, names = job.state["scan_tasks"], src.pieces() if src else []
        for i, piece in enumerate(pending):
            _in_window(rt, job_id, cancel, "while scanning")
            if src is not None and i + 1 < len(pending):
                src.read_next(names[slice(*tasks[pending[i + 1]])])
            scan(rt, job_id, piece, source, opened=src, main=main)
            checkpoint("scan.unit")
    else:
        _fan_out(rt, job_id, "scan", pending, lambda job: _workers(job, connections), lambda: None, cancel, threads=threads,
                 shared=main)
    rt.store.update_job(job_id, Phase.SCANNED)


def _write_all(rt: Runtime, job_id: str, cancel: threading.Event | None, only: list[str] | None = None) -> None:
    """Write every unit not done yet (or only those of ``only``, a canary, which leaves the phase at writing)."""
    job = rt.store.update_job(job_id, Phase.WRITING)
    spec = JobSpec.model_validate(job.spec)
    units = rt.store.units(job_id)
    pending = [u.unit_id for u in units if u.status != "done" and (only is None or u.unit_id in only)]
    if pending:  # one writer too is a thread of the fan-out: a concurrency set meanwhile then adds writers
        workers = min(_workers(job), len(pending))
        threads = workers <= setting(THREAD_WRITERS) or job.state.get("rows_in_scope", 0) < setting(IN_PROCESS_ROWS)
        _fan_out(rt, job_id, "write", pending, _workers, lambda: None, cancel, threads=threads,
                 shared=_writers(rt, job, spec) if threads else None)
    if only is None and not spec.dry_run:
        rt.store.update_job(job_id, Phase.WRITTEN)


def _writers(rt: Runtime, job: JobRecord, spec: JobSpec) -> Writers:
    """What a job's writer threads share (`write.Writers`)."""
    if spec.mode == "merge":
        table = rt.load_table(spec.table)
        contract = Contract.from_table(table)
        return Writers(main=MainReader(contract.time_column, job.state["range_start"], job.state["range_end"], contract.dedup_key,
                                       objects=rt.objects, dictionaries=coded_columns(table.schema().as_arrow(), contract.series_key)))
    table = planned_view(rt.load_table(spec.table), job.state)
    if spec.mode == "replace" and job.state.get("diff"):  # units that read main's rows of their partition
        contract = Contract.from_table(table)
        return Writers(MainAtPlan(table, contract, job.state, job.job_id, coded_columns(table.schema().as_arrow(), contract.series_key),
                                  objects=rt.objects), table)
    return Writers(table=table)


def _main_all(rt: Runtime, job_id: str, cancel: threading.Event | None, span: tuple[int, int] | None = None) -> None:
    """Read main's range for the job's diff (`timelake.steps.diff`): the main tasks not done yet (only
    those a canary's ``span`` needs), on threads (Arrow reads and spills outside the GIL), as many at
    once and in the same quiet hours as the units."""
    pending = diff.pending_main_tasks(rt, job_id, span)
    if pending:
        _fan_out(rt, job_id, "main", pending, _workers, lambda: None, cancel, threads=True)


def _check_all(rt: Runtime, job_id: str, cancel: threading.Event | None) -> None:
    """The per-file checks of validation, on the writers' pool, but for those done beside the stage commit
    (`_checking_beside`); `validate` then combines them. One file is checked inside `validate` itself."""
    if plan_checks(rt, job_id)["files"] > 1:
        listed = check_items(rt, job_id)
        items = unchecked(rt, job_id, listed)
        checked = [len(listed) - len(items)]

        def tick() -> None:
            checked[0] += 1
            rt.store.note_progress(job_id, "validate", {"done": checked[0], "total": len(listed), "of": "files"})

        rt.store.note_progress(job_id, "validate", {"done": checked[0], "total": len(listed), "of": "files"})
        _fan_out(rt, job_id, "check", items, _workers, tick, cancel, threads=True,
                 shared=CheckContext.of(rt, job_id, shared=True))


@contextlib.contextmanager
def _checking_beside(rt: Runtime, job_id: str) -> Iterator[None]:
    """Validation's per-file checks of the written files, run on the job's workers while the stage commit,
    one thread of Python, runs beside them (`validate.early_checks`): the checks read files, not the
    branch. A check that fails here (a file lost, the cause stage reports) is left to validation, which
    checks every file without facts again. The block waits for the checks it started; if it fails
    (interrupted, a crash point), those not yet started are dropped."""
    try:
        early = early_checks(rt, job_id)
    except Exception:  # the stage commit reports what is wrong (a file lost, the table gone); validation checks every file
        early = None
    if early is None:
        yield
        return
    context, items = early
    stop = threading.Event()

    def check(item: dict[str, Any]) -> None:
        if not stop.is_set():
            with contextlib.suppress(Exception):
                check_file(rt, job_id, item["file"], item["spec_id"], item["partition"], context)

    with ThreadPoolExecutor(max_workers=_workers(rt.store.get_job(job_id)), thread_name_prefix="timelake-early-check") as pool:
        for item in items:
            pool.submit(check, item)
        try:
            yield
        except BaseException:
            stop.set()
            raise


def _workers(job: JobRecord, cap: int | None = None) -> int:
    """Units to run at once, as the job's settings have it now (`timelake backfill set`), at most ``cap``
    (the source's connections, for scan tasks)."""
    wanted = current_setting(job, "max_concurrency") or os.cpu_count() or 1
    return min(wanted, cap) if cap else wanted


def _check(cancel: threading.Event | None, job_id: str, doing: str, rt: Runtime) -> JobRecord:
    """Stop between steps or units when interrupted (Ctrl-C) or when an abort was requested; the job as
    the store has it now."""
    if cancel is not None and cancel.is_set():
        raise Interrupted(f"job {job_id} interrupted {doing}; resume with: timelake backfill resume {job_id}")
    job = rt.store.get_job(job_id)
    if job.state.get("abort_requested"):
        raise Aborted(f"job {job_id} was aborted")
    return job


def _in_window(rt: Runtime, job_id: str, cancel: threading.Event | None, doing: str) -> JobRecord:
    """`_check`, then wait while the job's quiet hours are closed: still stopped by Ctrl-C or an abort."""
    while True:
        job = _check(cancel, job_id, doing, rt)
        until = closed_until(rt, job)
        if until is None:
            return job
        rt.clock.wait_until(until, lambda: _check(cancel, job_id, f"{doing} (paused for quiet hours)", rt))


def _fan_out(
    rt: Runtime, job_id: str, step: str, items: list[Any], workers: Callable[[JobRecord], int], tick: Callable[[], None],
    cancel: threading.Event | None, threads: bool = False, shared: Writers | CheckContext | MainReader | None = None,
) -> None:
    """Run ``step`` (scan, main, write or check) over ``items`` on a pool of processes, or of ``threads`` (which
    share ``shared``: main's reader for a merge job's scans, the writers' `write.Writers` for writes, the
    job's check context for checks),
    recording progress as items finish.

    As items finish the job is read again: ``workers(job)`` items run at once from then on (its settings
    may have changed), and outside its quiet hours none starts; once the running ones have finished,
    the fan-out waits for the window. Pools start their threads and processes as items need them, so
    the pool's bound is the largest concurrency a job may have."""
    config = rt.config.model_dump()
    doing = {"scan": "while scanning", "write": "while writing", "main": "while reading main's range"}.get(step, "while validating")
    if threads:
        pool: Executor = ThreadPoolExecutor(max_workers=MAX_CONCURRENCY, thread_name_prefix=f"timelake-{step}")
    else:
        pool = WorkerPool(MAX_CONCURRENCY)
    with pool:
        queue = list(reversed(items))
        running: dict[Future, Any] = {}
        finished = 0  # items done whose ``tick`` waits until the items that follow them have started
        try:
            while queue or running:
                job = _check(cancel, job_id, doing, rt)
                closed = bool(queue) and closed_until(rt, job) is not None
                if closed and not running:  # the last running unit has finished: wait for the window
                    job, closed = _in_window(rt, job_id, cancel, doing), False
                if queue and not closed:
                    for _ in range(min(len(queue), workers(job) - len(running))):
                        item = queue.pop()
                        if threads:
                            future = pool.submit(_run_item, rt, step, job_id, item, shared)
                        else:
                            future = pool.submit(_in_worker, config, step, job_id, item)
                        running[future] = item
                for _ in range(finished):  # a progress note (a store write, ~1 ms) no longer keeps a worker idle
                    tick()
                finished = 0
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    item = running.pop(future)
                    try:
                        future.result()
                    except BackfillError:
                        raise
                    except Exception as exc:
                        if _full_disk(exc):
                            raise  # run_job records it as a resumable full disk
                        raise BackfillError(f"job {job_id}: {step} of {item} failed: {type(exc).__name__}: {exc}") from exc
                    finished += 1
                    checkpoint(f"{step}.unit")
            for _ in range(finished):
                tick()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _in_worker(config: dict[str, Any], step: str, job_id: str, item: Any) -> dict[str, Any]:
    memory.tune()
    with memory.frozen():
        return _run_item(runtime_for(config), step, job_id, item)


def _run_item(rt: Runtime, step: str, job_id: str, item: Any,
              shared: Writers | CheckContext | MainReader | None = None) -> dict[str, Any]:
    if step == "scan":  # a worker of a fan-out, beside the others
        return scan(rt, job_id, item, shares_cores=True, main=shared if isinstance(shared, MainReader) else None)
    if step == "write":
        return write_unit(rt, job_id, item, shared if isinstance(shared, Writers) else None)
    if step == "main":
        return diff.read_main(rt, job_id, item)
    return check_file(rt, job_id, item["file"], item["spec_id"], item["partition"],
                      shared if isinstance(shared, CheckContext) else None)


class _Heartbeat:
    """The runs of a job in its state (``runs``: [start, last heartbeat] per process that ran it), kept
    current every `HEARTBEAT_SECONDS` by a thread: a crashed runner's time then ends at its last
    heartbeat, and the hours before a resume count for no step (`model.report.step_seconds`)."""

    def __init__(self, rt: Runtime, job_id: str) -> None:
        self.rt, self.job_id = rt, job_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"timelake-heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        now = time.time()
        self.runs = [*self.rt.store.get_job(self.job_id).state.get("runs", []), [now, now]][-MAX_RUNS:]
        self.rt.store.update_job(self.job_id, runs=self.runs, runner={"pid": os.getpid(), "host": socket.gethostname()})
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._note()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            self._note()

    def _note(self) -> None:
        """Only this process writes ``runs`` while it holds the job, so writing its own copy loses nothing.
        A heartbeat that cannot be written (a full disk) costs the job's clock, never the job."""
        self.runs[-1][1] = time.time()
        with contextlib.suppress(Exception):
            self.rt.store.update_job(self.job_id, runs=self.runs)
