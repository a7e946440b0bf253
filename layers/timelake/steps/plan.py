"""Plan and cut: the steps around the source scan.

``plan`` checks the job against the table and the source schema (fail fast, before reading data)
and lists the source pieces to scan. ``cut`` merges the scan results, decides the job range, cuts
the work units (table partition × series slice, each sized to write ONE file near the target size),
and, unless it is a dry run, takes the lease and creates the branch. A dry run changes nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
from collections import Counter

import numpy as np
import pyarrow.fs as pafs
from datetime import UTC, datetime
from typing import Any

from timelake import memory
from timelake.errors import InvalidJob, ValidationFailed
from timelake.model.commit import with_retry
from timelake.model.contract import Contract, writable_spec
from timelake.model.cost import estimate_cost
from timelake.model.diff import compares
from timelake.model.layout import MainReader, PartitionKey, equality_deletes, file_bounds, partition_codes, time_filter
from timelake.model.lineage import PlanMark, main_tasks, planned_view
from timelake.model.spec import FIRST_YEAR, LAST_MICROS, LAST_YEAR, JobSpec, current_spec
from timelake.model.timeutil import (US_PER_DAY, floor_to, from_micros, iso, next_boundary, partition_starts,
                                     subtract_duration, to_micros)
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobRecord, JobState, Lease, Phase, UnitRecord
from timelake.sources.base import Source
from timelake.steps import failures, rejects
from timelake.steps.scan import (
    DIRECT_MAX_ROWS, ScanContext, ScanResult, direct_main, direct_name, dst_failure, mapper_for, open_job_source,
    read_result, refuse_dst, scan_task,
)

# A writer holds its unit's rows, so a unit never has more than this many, however well they compress
# (a near-constant sensor makes a 128 MB file of hundreds of millions of rows): tests/functions/test_memory.py
# proves a unit this size, of the benchmark's row shape, fits the write Lambda's memory.
MAX_UNIT_ROWS = 1 << 25
MIN_TASK_BYTES = 8 << 20  # a scan task has a fixed cost (a Lambda, a connection): none reads less than this
# Each task spills to a file of its own, and a unit reads its rows from every task's file that holds its
# partition: with a file per device, each of them. Four tasks a worker made a per-device job at 1x 5-8% slower
# than two (each unit read eight files, not four); one a worker gained 1.5% more, with nothing left to even out
# a slow task.
TASKS_PER_WORKER = 2
DIRECT_MAX_PIECES = 10_000  # telling those partitions reads every piece's footer at plan time
DIRECT_SPAN_PARTITIONS = 64  # a piece over more partitions than this leaves them to the spill


def plan(rt: Runtime, job_id: str, source: Any = None, parallelism: int | None = None) -> dict[str, Any]:
    """Plan step. Input: a job id (the job record holds the spec); ``source`` only for in-memory data;
    how many workers will scan (default: the job's max_concurrency, else this machine's cores).
    Output: the number of scan tasks and where their list is (a JSON array a Distributed Map reads)."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    table = rt.load_table(spec.table)
    src = open_job_source(spec, source, table)
    now = datetime.now(UTC)
    ctx = context(spec, table, to_micros(now))
    try:
        writable_spec(table, ctx.contract.time_column)
    except ValueError as exc:
        raise InvalidJob(str(exc)) from exc
    mapper = mapper_for(ctx, src)  # a wrong map, a naive time without tz, ... fail here, before reading data
    clear_staging(rt, job_id)
    sizes = src.sizes()
    tasks = scan_tasks(sizes, spec.max_concurrency or parallelism or os.cpu_count() or 1)
    manifest = write_json(rt, job_id, "scan/tasks.json", [{"job_id": job_id, "piece": i} for i in range(len(tasks))])
    direct, span = plan_direct(rt, job_id, spec, ctx, src, mapper, tasks)
    if span is not None:  # the scan tasks read main's rows of the partitions they write themselves
        refuse_equality_deletes(table, ctx.contract.time_column, *span)
    rt.store.update_job(job_id, Phase.SCANNING, planned_at_us=to_micros(now), scan_tasks=tasks, source_bytes=sum(sizes),
                        schema_id=table.schema().schema_id, spec_id=table.spec().spec_id,
                        direct_partitions=direct, direct_span=span,
                        source_uri=src.uri, source_fingerprint=src.fingerprint(), source_plan=src.plan_state(),
                        columns_filled_with_null=mapper.filled_with_null,
                        ignored_source_columns=mapper.ignored_source_columns)
    return {"job_id": job_id, "scan_tasks": len(tasks), "manifest": manifest}


def refuse_equality_deletes(table: Any, column: str, start_us: int | None, end_us: int | None) -> None:
    """Stop a job whose range main holds equality deletes for (`layout.equality_deletes`) before it writes a
    file, saying how to fold them into the data files first."""
    found = equality_deletes(table, column, start_us, end_us)
    if found:
        name = ".".join(table.name())
        raise InvalidJob(
            f"table {name} has {len(found)} equality delete file(s) over [{iso(start_us)}, {iso(end_us)}) (e.g. "
            f"{found[0]}; a Flink upsert writes them), which pyiceberg, through which the engine reads main, cannot "
            f"apply; fold them into the data files first: CALL <catalog>.system.rewrite_data_files(table => '{name}', "
            f"options => map('delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))")


def scan_tasks(sizes: list[int], parallelism: int) -> list[list[int]]:
    """Runs of consecutive source pieces, [first, last), of about equal bytes: `TASKS_PER_WORKER` per
    worker so that uneven files even out, and no task below a few MB (a task has a fixed cost). Fewer
    tasks than that are made a multiple of the workers where each still reads half the minimum, so no
    worker idles through the last round (3 tasks on 2 workers left one idle for a third of the scan)."""
    total = sum(sizes)
    count = max(1, min(len(sizes), round(total / max(total / (TASKS_PER_WORKER * parallelism), MIN_TASK_BYTES))))
    if count % parallelism and count < TASKS_PER_WORKER * parallelism:
        rounded = math.ceil(count / parallelism) * parallelism
        if rounded <= len(sizes) and total / rounded >= MIN_TASK_BYTES / 2:
            count = rounded
    tasks: list[list[int]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= total * (len(tasks) + 1) / count and len(tasks) < count - 1:
            tasks.append([start, i + 1])
            start = i + 1
    if start < len(sizes) or not tasks:
        tasks.append([start, len(sizes)])
    return tasks


def plan_direct(rt: Runtime, job_id: str, spec: JobSpec, ctx: ScanContext, src: Source, mapper: Any,
                tasks: list[list[int]]) -> tuple[int, list[int] | None]:
    """Find the partitions a scan task can write as their final file itself, and give each task its list
    (`direct_uri`); returns how many, and the [lo, hi) µs they span together (None: there are none; main's
    plan for the scan tasks, `tasks_main`). Such a partition's rows all lie in the pieces of one task, as the
    pieces' footer statistics of the time column tell (a day-ordered export: a file per day), and are
    few enough for the task to hold; the task writes it once it has read the last of those pieces,
    exactly as the write step would, and the spill's round trip is saved. Not for a dry run, which writes
    nothing, nor a canary, which writes one day before the person approves the rest, nor where the scan
    may not put data files (``scan_writes``: the AWS stack's scan role reads only)."""
    if spec.dry_run or spec.canary or not rt.config.scan_writes or (spec.mode == "replace" and spec.diff):
        return 0, None
    pieces = src.pieces()
    bounds = src.column_bounds(mapper.source_of[ctx.contract.time_column]) if len(pieces) <= DIRECT_MAX_PIECES else None
    if not bounds:
        return 0, None
    task_of = np.zeros(len(pieces), dtype=np.int64)
    for task, (first, last) in enumerate(tasks):
        task_of[first:last] = task
    found: dict[PartitionKey, dict[str, Any]] = {}
    wide: list[tuple[int, int]] = []  # time spans of pieces over several partitions: those partitions are shared
    finest = ctx.contract.tiers[0].transform if src.on_partition_edges() else None  # tiers go from fine to coarse
    spans = mapper.utc_bounds([(kind, low, high) for kind, low, high, _ in bounds])
    if any(span is None for span, (*_, rows) in zip(spans, bounds, strict=True) if rows):
        return 0, None
    within = _partitions_within([span for span in spans if span is not None], finest, ctx)
    for piece, (*_, rows) in enumerate(bounds):
        span = spans[piece]
        if not rows or span is None:
            continue
        keys = within[span]
        if keys is None:  # a file over several days may share them with other files
            wide.append((span[0], span[1] + 1))
            continue
        for key in keys:  # a piece over several whole partitions (database pieces cut on their edges)
            entry = found.setdefault(key, {"tasks": set(), "rows": 0, "last": piece})
            entry["tasks"].add(int(task_of[piece]))
            entry["rows"] += rows / len(keys)
            entry["last"] = max(entry["last"], piece)
    per_task: dict[int, dict[str, dict[str, Any]]] = {}
    covering: list[int] | None = None
    for key, entry in found.items():
        lo, hi = key.range
        if len(entry["tasks"]) > 1 or entry["rows"] > DIRECT_MAX_ROWS or any(a < hi and b > lo for a, b in wide):
            continue
        per_task.setdefault(entry["tasks"].pop(), {})[key.name] = {
            "spec_id": key.spec_id, "transform": key.transform, "value": key.value, "last": entry["last"]}
        covering = [min(covering[0], lo), max(covering[1], hi)] if covering else [lo, hi]
    for task, partitions in per_task.items():
        write_json(rt, job_id, direct_name(task), partitions)
    return sum(len(p) for p in per_task.values()), covering


def _partitions_within(spans: list[tuple[int, int]], finest: str | None,
                       ctx: ScanContext) -> dict[tuple[int, int], list[PartitionKey] | None]:
    """The partitions that each span [low, high] of UTC microseconds touches, found at each boundary of the
    ``finest`` granularity; None past DIRECT_SPAN_PARTITIONS of them, or past one when ``finest`` is None
    (the pieces were not cut on partition edges: then all spans' ends are placed at once)."""
    if finest is None:
        ends = np.array([end for span in spans for end in span], dtype=np.int64)
        codes, keys = partition_codes(ends, ctx.contract, ctx.cutoffs) if len(ends) else (ends, [])
        return {span: [keys[first]] if first == last else None
                for span, first, last in zip(spans, codes[0::2].tolist(), codes[1::2].tolist(), strict=True)}
    found: dict[tuple[int, int], list[PartitionKey] | None] = {}
    for low, high in spans:
        starts = partition_starts(low, high, finest, DIRECT_SPAN_PARTITIONS - 1)
        if starts is None:
            found[(low, high)] = None
            continue
        codes, keys = partition_codes(np.array([low, *starts, high], dtype=np.int64), ctx.contract, ctx.cutoffs)
        found[(low, high)] = [keys[code] for code in sorted(set(codes.tolist()))]
    return found


def context(spec: JobSpec, table: Any, now_us: int) -> ScanContext:
    contract = Contract.from_table(table)
    now = from_micros(now_us)
    retention = contract.retention if contract.retention and not spec.override_retention else None
    return ScanContext(
        spec=spec, contract=contract, target=table.schema().as_arrow(), cutoffs=contract.tier_cutoffs(now),
        retention_cutoff=to_micros(subtract_duration(now, retention)) if retention else None,
        start_us=to_micros(spec.start) if spec.start else None, end_us=to_micros(spec.end) if spec.end else None,
    )


def scan(rt: Runtime, job_id: str, piece: int, source: Any = None, opened: Source | None = None,
         shares_cores: bool = False, main: MainReader | None = None) -> dict[str, Any]:
    """Scan step. Input: job id and piece index. Output: the piece's row count. ``opened``: the job's
    source, already open (one process scanning task after task keeps its connection and read-ahead);
    ``shares_cores``: other scans run beside this one, a worker per core (`Source.share_cores`);
    ``main``: main's reader shared by the scan tasks of this process (`tasks_main`)."""
    job = rt.store.get_job(job_id)
    spec = current_spec(job.spec, job.state)  # the source rate as the job's settings have it now
    table = job_table(rt, job)
    ctx = context(spec, table, job.state["planned_at_us"])
    src = opened or open_job_source(spec, source, table, job.state.get("source_plan"))
    if shares_cores:
        src.share_cores()
    first, last = job.state["scan_tasks"][piece]
    try:
        # a task allocates tens of thousands of short-lived, acyclic objects (batches, arrays, slices): the
        # collector's full pass over the whole process heap they set off frees nothing, and holds the
        # interpreter from the other scan threads meanwhile
        with memory.collector_paused():
            result = scan_task(rt, ctx, job_id, piece, range(first, last), src, table, main)
    except Exception as exc:
        failures.note(rt, job_id, f"scan-task-{piece}", exc)
        raise
    failures.clear(rt, job_id, f"scan-task-{piece}")
    return {"job_id": job_id, "piece": piece, "rows": result.rows_in_source}


def tasks_main(rt: Runtime, job_id: str) -> MainReader | None:
    """Main for every scan task this process runs, beside or after one another, in a merge job whose scan
    tasks write partitions themselves: over all those partitions (`plan_direct`'s span), planned once for
    the tasks, not once a task (a plan was 19 ms of a task's wall time beside another task's writes).
    None for any other job. A task in a process of its own (a Lambda, a pool worker) plans its own."""
    job = rt.store.get_job(job_id)
    span = job.state.get("direct_span")
    spec = current_spec(job.spec, job.state)
    if not span or spec.mode != "merge":
        return None
    return direct_main(context(spec, job_table(rt, job), job.state["planned_at_us"]), span[0], span[1], objects=rt.objects)


def pending_pieces(rt: Runtime, job_id: str) -> list[int]:
    """Scan tasks without a result yet."""
    tasks = rt.store.get_job(job_id).state["scan_tasks"]
    return [i for i in range(len(tasks)) if read_result(rt, job_id, i) is None]


def cut(rt: Runtime, job_id: str) -> dict[str, Any]:
    """Cut step. Input: job id. Merges the scans, cuts units, takes the lease, creates the branch."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    table = job_table(rt, job)
    contract = Contract.from_table(table)
    total = ScanResult()
    missing = []
    for piece in range(len(job.state["scan_tasks"])):
        result = read_result(rt, job_id, piece)
        if result is None:
            missing.append(piece)
        else:
            total.merge(result)
    if missing:
        cause = failures.first(rt, job_id, [f"scan-task-{i}" for i in missing])
        raise InvalidJob(f"job {job_id}: {len(missing)} scan task(s) not done"
                         + (f"; {cause}" if cause else f" yet (first: {missing[0]}); resume the job"))
    if total.rows_in_source == 0:
        raise InvalidJob(f"source '{job.state['source_uri']}' has no rows")
    start_us = to_micros(spec.start) if spec.start else None
    end_us = to_micros(spec.end) if spec.end else None
    if end_us is None and total.max_us is not None and total.max_us >= LAST_MICROS:
        raise InvalidJob(f"source '{job.state['source_uri']}' holds times in year 9999 (latest {iso(total.max_us)}); "
                         f"jobs cover years {FIRST_YEAR}-{LAST_YEAR}: pass an end to leave those rows out")
    range_start, range_end = _job_range(total, start_us, end_us)
    refuse_equality_deletes(table, contract.time_column, range_start, range_end)
    units = _cut_units(total, contract)
    state: JobState = {
        "rows_in_source": total.rows_in_source,
        "rows_in_scope": total.rows_in_scope,
        "rows_rejected": dict(total.rejected),
        "rejected_examples": total.examples,
        "rows_outside_range": total.rows_outside_range,
        "rows_outside_retention": total.rows_outside_retention,
        "time_range": {"min": iso(total.min_us), "max": iso(total.max_us)},
        "range_start": range_start,
        "range_end": range_end,
        "source_gaps": _gaps(total, range_start, range_end),
        "units_total": len(units),
        "estimated_cost": estimate_cost(total.rows_in_scope, len(units), spec.max_concurrency),
        "partition_sums": {p.key.name: p.check_sum for p in total.partitions.values()},
        "check_column": contract.check_column,
        "value_issues": total.issues.to_json(),
        "states": dict(total.states),
        "issue_days": {str(day): rows for day, rows in sorted(total.issue_days.items())},
        rejects.CHECK: rejects.budget(spec, total.rows_in_source, total.issues),
    }
    over_budget = rejects.failure(state[rejects.CHECK], total.issues)
    predicts = compares(spec.mode, spec.diff)
    if spec.dry_run:
        state.update({"overlap_existing_rows": total.overlap_existing_rows,
                      "rows_duplicate_in_source": total.duplicates_in_source,
                      "would_fail": dst_failure(total, spec.dst_policy) or over_budget})
        if not predicts:
            clear_staging(rt, job_id)
            rt.store.update_job(job_id, Phase.DRY_RUN_COMPLETE, **state)
            return {"job_id": job_id, "dry_run": True, "units": len(units)}
        # the diff is predicted as the run counts it: units sort their rows and compare, writing nothing
        state["diff"] = plan_main_tasks(rt, job_id, table, contract, spec.mode, range_start, range_end, units,
                                        PlanMark.at(table), spec.max_concurrency or os.cpu_count() or 1)
        rt.store.put_units(job_id, units)
        rt.store.update_job(job_id, Phase.PLANNED, **state)
        return {"job_id": job_id, "dry_run": True, "units": len(units)}
    refuse_dst(total, spec.dst_policy)
    if over_budget:  # before the lease and the branch: nothing to write, nothing to undo
        state.update({"checks": [c for c in [rejects.check(state)] if c], "error": f"{rejects.CHECK}: {over_budget}"})
        rt.store.update_job(job_id, Phase.FAILED_VALIDATION, **state)
        raise ValidationFailed(f"job {job_id}: validation failed ({rejects.CHECK}): {over_budget}; nothing was "
                               "written or published, main is untouched")
    rt.store.acquire_lease(Lease(spec.table, range_start, range_end, job_id))
    branch = f"backfill/{job_id}"
    mark = PlanMark.at(table)
    if mark.snapshot_id is not None:  # on an empty table, stage creates the branch at its own snapshot: main gets no commit
        fork_branch(table, branch, mark.snapshot_id)
    state.update({"branch": branch, **mark.state()})
    if predicts:
        state["diff"] = plan_main_tasks(rt, job_id, table, contract, spec.mode, range_start, range_end, units, mark,
                                        spec.max_concurrency or os.cpu_count() or 1)
    rt.store.put_units(job_id, units)
    write_json(rt, job_id, "units.json", [{"job_id": job_id, "unit_id": u.unit_id} for u in units])
    rt.store.update_job(job_id, Phase.PLANNED, **state)
    return {"job_id": job_id, "dry_run": False, "units": len(units)}


def job_table(rt: Runtime, job: JobRecord) -> Any:
    """The job's table as its plan saw it (`lineage.planned_view`): the steps that map, write and check
    the job's rows work in the schema and partition spec those rows were planned in."""
    return planned_view(rt.load_table(job.table), job.state)


def fork_branch(table: Any, branch: str, snapshot_id: int) -> None:
    def fork(current: Any) -> None:
        if current.metadata.refs.get(branch) is None:  # a retry may find it made by the attempt that "failed"
            current.manage_snapshots().create_branch(snapshot_id=snapshot_id, branch_name=branch).commit()

    with_retry(table, fork, "create branch")


def _job_range(total: ScanResult, start_us: int | None, end_us: int | None) -> tuple[int, int]:
    """The leased (and, in replace mode, replaced) range: the job's bounds, else the source's whole days."""
    if total.min_us is None or total.max_us is None:
        raise InvalidJob("the source has no rows with a valid time")
    lo = start_us if start_us is not None else floor_to(total.min_us, "day")
    hi = end_us if end_us is not None else next_boundary(total.max_us, "day")
    return lo, hi


def _gaps(total: ScanResult, start: int, end: int) -> list[dict[str, Any]]:
    """Runs of whole days in the range with no source rows in scope."""
    gaps: list[dict[str, Any]] = []
    day, last = start // US_PER_DAY, (end - 1) // US_PER_DAY
    while day <= last:
        if total.days.get(day):
            day += 1
            continue
        run = day
        while day <= last and not total.days.get(day):
            day += 1
        gaps.append({"start": iso(run * US_PER_DAY)[:10], "end": iso((day - 1) * US_PER_DAY)[:10], "days": day - run})
    return gaps


def _cut_units(total: ScanResult, contract: Contract) -> list[UnitRecord]:
    """One unit per partition and series slice; slices per partition chosen so each file is near target."""
    bytes_per_row = total.sample_bytes / total.sample_rows if total.sample_rows else 1.0
    units = []
    for part in sorted(total.partitions.values(), key=lambda p: p.key.range):
        lo, hi = part.key.range
        if part.direct is not None:  # its scan task wrote its one file: the unit is done
            units.append(UnitRecord(
                unit_id=f"{part.key.name}-0of1", status="done", result=part.direct,
                info={"partition": part.key.name, "spec_id": part.key.spec_id, "transform": part.key.transform,
                      "value": part.key.value, "start": lo, "end": hi, "buckets": None, "spill": [],
                      "rows_estimate": part.rows, "direct": True},
            ))
            continue
        wanted = max(1, round(part.rows * bytes_per_row / contract.target_file_size), math.ceil(part.rows / MAX_UNIT_ROWS)) \
            if contract.series_key else 1
        slices = _balance(part.buckets, min(wanted, len(part.buckets) or 1))
        while len(slices) < len(part.buckets) and max(sum(part.buckets[b] for b in s) for s in slices) > MAX_UNIT_ROWS:
            slices = _balance(part.buckets, len(slices) + 1)  # a run of buckets may overshoot: one slice more
        for i, buckets in enumerate(slices):
            units.append(UnitRecord(
                unit_id=f"{part.key.name}-{i}of{len(slices)}",
                info={
                    "partition": part.key.name, "spec_id": part.key.spec_id, "transform": part.key.transform,
                    "value": part.key.value, "start": lo, "end": hi, "buckets": buckets if len(slices) > 1 else None,
                    "spill": sorted(part.spill), "rows_estimate": sum(part.buckets[b] for b in buckets) or part.rows,
                },
            ))
    return units


MAIN_TASKS = "diff/main-tasks.json"  # the main tasks of a job with a diff: what each reads of main's range
LOCAL = "diff/local.json"  # the partitions whose one unit reads main's rows itself, and (replace) the spilled ones
MAIN_TASK_BYTES = 256 << 20  # main's data file bytes a main task reads, at most (save one larger file)


def plan_main_tasks(rt: Runtime, job_id: str, table: Any, contract: Contract, mode: str, start: int, end: int,
                    units: list[UnitRecord], mark: PlanMark, parallelism: int) -> dict[str, Any]:
    """Who reads main's rows of the job's range for its diff (`timelake.steps.diff`), each file once.

    In replace mode a partition of one unit has its unit read main's rows there itself (``main_local``):
    it compares with them as they come, and nothing is spilled. In merge mode a partition its scan task
    wrote was counted by that unit as it read main's rows to drop the keys main holds (``main_counted``),
    if it read them at ``mark``. The main tasks read the rest: main's
    data files at ``mark`` (the plan) in the other partitions, cut into about four tasks a worker, of at
    most `MAIN_TASK_BYTES` each; in replace mode they spill what they read for the units of partitions
    cut into several, and every unit learns the spills of the tasks whose span meets its partition.

    A task is a time span and the files it reads there: files whose time bounds overlap form clusters,
    consecutive clusters share a task up to the byte budget, and a cluster above it is shared by several
    tasks of the same span, each with its own files (``files``; None: every file of the span). A
    task's span, not only its files, is what lets it find the rows again should another engine expire
    the plan's snapshot and compact the files before the task runs."""
    parts = Counter(u.info["partition"] for u in units)
    if mode == "replace":
        local = {name for name, count in parts.items() if count == 1}
    else:  # merge: a partition its scan task wrote was counted there, if main's rows were read at the plan's snapshot
        counted = [u for u in units if u.info.get("direct") and "main_counted_at" in u.result
                   and u.result["main_counted_at"] == mark.snapshot_id]
        for unit in counted:
            unit.info["main_counted"] = True
        local = {u.info["partition"] for u in counted}
    covered = _merged_spans([(max(u.info["start"], start), min(u.info["end"], end)) for u in units
                             if u.info["partition"] in local])
    spans: list[tuple[int, int, str, int]] = []
    if mark.snapshot_id is not None and not _inside(covered, start, end):  # else every file lies in counted partitions
        field = table.schema().find_field(contract.time_column)
        planned = main_tasks(table, time_filter(contract.time_column, start, end), snapshot_id=mark.snapshot_id)
        for task in planned:
            lo, hi = file_bounds(task.file, field)
            lo, hi = start if lo is None else max(lo, start), end if hi is None else min(hi + 1, end)
            size = task.file.file_size_in_bytes + sum(d.file_size_in_bytes for d in task.delete_files)
            if lo < hi and not _inside(covered, lo, hi):
                spans.append((lo, hi, task.file.file_path, size))
    total = sum(size for *_, size in spans)
    budget = min(MAIN_TASK_BYTES, max(MIN_TASK_BYTES, total // (4 * max(parallelism, 1)) + 1))
    tasks = _main_task_spans(sorted(spans), budget)
    write_json(rt, job_id, MAIN_TASKS, tasks)
    write_json(rt, job_id, LOCAL, {"local": sorted(local), "spilled": sorted(n for n, c in parts.items() if c > 1)
                                   if mode == "replace" else []})
    if mode == "replace":
        for unit in units:
            lo, hi = unit.info["start"], unit.info["end"]
            unit.info["main_local"] = unit.info["partition"] in local
            unit.info["main_spill"] = [] if unit.info["main_local"] else [
                main_spill_uri(rt, job_id, i) for i, t in enumerate(tasks) if t["start"] < hi and t["end"] > lo]
    return {"tasks": len(tasks), **mark.state()}


def _merged_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi) spans joined where they overlap or touch, sorted."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _inside(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether [lo, hi) lies within one of the joined ``spans``."""
    at = bisect.bisect_right(spans, (lo, float("inf"))) - 1
    return at >= 0 and spans[at][0] <= lo and hi <= spans[at][1]


def _main_task_spans(spans: list[tuple[int, int, str, int]], budget: int) -> list[dict[str, Any]]:
    clusters: list[list[tuple[int, int, str, int]]] = []
    for span in spans:
        if clusters and span[0] < max(hi for _, hi, _, _ in clusters[-1]):
            clusters[-1].append(span)
        else:
            clusters.append([span])
    tasks: list[dict[str, Any]] = []
    joined = 0  # bytes of the last task, while it takes whole clusters
    for cluster in clusters:
        lo, hi = cluster[0][0], max(h for _, h, _, _ in cluster)
        size = sum(s for *_, s in cluster)
        if size > budget:
            part: list[str] = []
            taken = 0
            for _, _, path, bytes_ in cluster:
                if part and taken + bytes_ > budget:
                    tasks.append({"start": lo, "end": hi, "files": part, "rewrites": not any(t["start"] == lo for t in tasks)})
                    part, taken = [], 0
                part.append(path)
                taken += bytes_
            tasks.append({"start": lo, "end": hi, "files": part, "rewrites": not any(t["start"] == lo for t in tasks)})
            joined = budget
        elif tasks and tasks[-1]["files"] is None and joined + size <= budget:
            tasks[-1]["end"] = hi
            joined += size
        else:
            tasks.append({"start": lo, "end": hi, "files": None, "rewrites": True})
            joined = size
    return tasks


def main_spill_uri(rt: Runtime, job_id: str, task: int) -> str:
    """Where main task ``task`` spills main's rows (replace mode), by partition and series bucket."""
    return rt.staging_path(job_id, "diff", "main", f"t{task:05d}.arrow")


def _balance(buckets: dict[int, int], slices: int) -> list[list[int]]:
    """Series buckets cut into ``slices`` contiguous runs of nearly equal rows: a run of buckets is a run
    of batches in every spill file (see `timelake.steps.spill`), so a unit reads few, long byte ranges."""
    items = sorted(buckets.items())
    total = sum(rows for _, rows in items)
    groups: list[list[int]] = [[]]
    done = 0
    for i, (bucket, rows) in enumerate(items):
        groups[-1].append(bucket)
        done += rows
        still_open = slices - len(groups)
        if still_open and (done >= total * len(groups) / slices or len(items) - i - 1 == still_open):
            groups.append([])
    return groups


def clear_staging(rt: Runtime, job_id: str, keep: str | None = None) -> None:
    """Delete the job's scratch files, all of them or all but the folder ``keep`` (a dry run's diff)."""
    fs, root = rt.objects.filesystem(rt.staging_path(job_id))
    with contextlib.suppress(FileNotFoundError):
        if keep is None:
            fs.delete_dir(root)
            return
        for entry in fs.get_file_info(pafs.FileSelector(root)):
            if entry.base_name == keep:
                continue
            if entry.type == pafs.FileType.Directory:
                fs.delete_dir(entry.path)
            else:
                fs.delete_file(entry.path)


CHUNKS = "publish/chunks.json"  # the publish chunks, [start, end) each, as the first publish attempt cut them


def chunk_keys(rt: Runtime, job_id: str, publish_by: str | None) -> list[str]:
    """The keys of the job's publish chunks, in commit order (none before publish has cut them)."""
    return [iso(lo) if publish_by else "all" for lo, _ in read_json(rt, job_id, CHUNKS) or []]


def read_json(rt: Runtime, job_id: str, name: str) -> Any:
    """A JSON document of the job's staging area, or None if there is none."""
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, name))
    try:
        with fs.open_input_stream(path) as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None


def write_json(rt: Runtime, job_id: str, name: str, payload: Any) -> dict[str, str]:
    """A JSON document in the job's staging area; returns its bucket/key (for an ItemReader) and URI."""
    uri = rt.staging_path(job_id, name)
    fs, path = rt.objects.filesystem(uri)
    rt.objects.make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(payload).encode())
    bucket, _, key = uri.split("://", 1)[-1].partition("/")
    return {"bucket": bucket, "key": key, "uri": uri}
