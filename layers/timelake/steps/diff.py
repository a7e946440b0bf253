"""The diff of a replace or merge job (`timelake.model.diff`): the main tasks that read main's rows of the
job's range that no unit reads itself, and the combine of every task's and unit's cells into the job's diff.

In replace mode a partition of one unit is read by its unit (`timelake.steps.write`). The main tasks
read the rest, after the cut and before the units (a canary's before its units, the rest after
approval): each reads its files of main at the plan's snapshot, counts their rows per day and series
and, for the partitions cut into several units, spills them by partition and series bucket exactly as
the scan spills the source's, so that each unit reads main's rows of its own slice and nothing else.
In merge mode they read all of main's range, and only count it. `conclude` sums the cells at the stage
step (the whole job), for the canary (its day) and at the end of a dry run, which runs the same tasks
and units without writing any file into the table, so that it predicts the same diff.
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from timelake.errors import BackfillError
from timelake.model.contract import Contract
from timelake.model.diff import (
    Before, combine, compared_columns, facts_uri, finish, grouped, keep_samples, mark_of, plain, read_facts, rows_at_plan,
    summarize,
)
from timelake.model.layout import SnapshotRange, micros, partition_codes
from timelake.model.lineage import planned_view
from timelake.model.spec import JobSpec
from timelake.model.timeutil import US_PER_DAY, iso
from timelake.ports.files import ObjectIO, reads_at_once
from timelake.ports.runtime import Runtime
from timelake.ports.store import Phase, UnitRecord
from timelake.steps import spill
from timelake.steps.plan import LOCAL, MAIN_TASKS, clear_staging, context, main_spill_uri, read_json
from timelake.steps.scan import HELD_BYTES, series_bucket

SCOPES = ("job", "canary")


def main_task_name(task: int) -> str:
    return f"t{task:05d}"


def read_main(rt: Runtime, job_id: str, task: int) -> dict[str, Any]:
    """Main task. Input: job id and task number. Reads main's rows of the task's files and span at the
    plan's snapshot, a row group at a time; counts them per day and series, keeps a few per day, and in
    replace mode spills them for the units. Idempotent: its facts file, written last, marks it done."""
    uri = facts_uri(rt, job_id, "main", main_task_name(task))
    if _exists(uri, objects=rt.objects):
        return {"job_id": job_id, "task": task, "done": True}
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    table = rt.load_table(spec.table)
    planned = planned_view(table, job.state)
    contract = Contract.from_table(planned)
    target = planned.schema().as_arrow()
    columns = compared_columns(target, contract)
    cutoffs = context(spec, planned, job.state["planned_at_us"]).cutoffs
    definition = (read_json(rt, job_id, MAIN_TASKS) or [])[task]
    parts_of = read_json(rt, job_id, LOCAL) or {}
    local = set(parts_of.get("local", []))  # partitions whose unit reads main's rows itself
    spilled = set(parts_of.get("spilled", []))  # partitions of several units, which read main's rows from the spill
    lo, hi = definition["start"], definition["end"]
    files = set(definition["files"]) if definition["files"] is not None else None
    snapshot_id, keep = rows_at_plan(planned, mark_of(job.state), job_id, files, definition["rewrites"])
    reader = SnapshotRange(planned, contract.time_column, lo, hi, tuple(target.names), snapshot_id, keep, objects=rt.objects)
    dictionaries = spill.Dictionaries(target, contract.series_key)
    out = None
    if spec.mode == "replace":  # created even when it stays empty: the units read every spill their partition lists
        fs, path = rt.objects.filesystem(main_spill_uri(rt, job_id, task))
        rt.objects.make_parent(fs, path)
        out = spill.SpillFile(main_spill_uri(rt, job_id, task), dictionaries, spill.join_bytes(contract.target_file_size),
                              objects=rt.objects)
    before, rows_read = Before(columns, contract), 0
    try:
        for batch in reader.batches(lo, hi, dictionaries.coded):
            rows = pa.Table.from_batches([batch])
            ts = micros(rows, contract.time_column)
            codes, keys = partition_codes(ts, contract, cutoffs)
            if local and any(k.name in local for k in keys):
                mine = ~np.isin(codes, [i for i, k in enumerate(keys) if k.name in local])
                rows, ts, codes = rows.filter(pa.array(mine)), ts[mine], codes[mine]
            if not rows.num_rows:
                continue
            rows_read += rows.num_rows
            if out is not None:
                _spill(out, dictionaries, rows, codes, keys, spilled, contract)
            before.add(rows, ts // US_PER_DAY)
    except BaseException:
        if out is not None:
            out.discard()
        raise
    if out is not None:
        out.close()
    before.write(uri, objects=rt.objects)
    return {"job_id": job_id, "task": task, "rows": rows_read}


def _spill(out: spill.SpillFile, dictionaries: spill.Dictionaries, rows: pa.Table, codes: np.ndarray, keys: list[Any],
           spilled: set[str], contract: Contract) -> None:
    """Hold the rows of the partitions whose units read main's rows from the spill (not those of days the
    source lacks: no unit reads them), by partition and series bucket; flush past `HELD_BYTES`."""
    wanted = [i for i, k in enumerate(keys) if k.name in spilled]
    if not wanted:
        return
    if len(wanted) < len(keys):
        mine = np.isin(codes, wanted)
        rows, codes = rows.filter(pa.array(mine)), codes[mine]
    buckets = series_bucket(rows, contract.series_key) if contract.series_key else None
    out.hold(dictionaries.code(rows), [(k.spec_id, k.value) for k in keys], codes, buckets, rows.nbytes)
    if out.held_bytes > HELD_BYTES:
        out.flush()


def pending_main_tasks(rt: Runtime, job_id: str, span: tuple[int, int] | None = None) -> list[int]:
    """The main tasks not done yet (of those whose span meets ``span``, a canary's)."""
    job = rt.store.get_job(job_id)
    if not job.state.get("diff"):
        return []
    tasks = read_json(rt, job_id, MAIN_TASKS) or []
    wanted = [i for i, t in enumerate(tasks) if span is None or (t["start"] < span[1] and t["end"] > span[0])]
    with ThreadPoolExecutor(max_workers=reads_at_once(rt.objects.filesystem(rt.staging_path(job_id))[0])) as pool:
        done = list(pool.map(lambda i: _exists(facts_uri(rt, job_id, "main", main_task_name(i)), objects=rt.objects), wanted))
    return [i for i, finished in zip(wanted, done, strict=True) if not finished]


def _exists(uri: str, *, objects: ObjectIO) -> bool:
    fs, path = objects.filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def conclude(rt: Runtime, job_id: str, scope: str = "job", units: list[UnitRecord] | None = None,
             span: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """The job's diff from the cells of its main tasks and units: of the whole job, or (``scope``
    "canary") of the canary's units and of main's rows in their ``span``. Kept as a summary (JSON) and
    its cells (Parquet) beside the job's scratch files; the report keeps the totals. None for a job
    without a diff.

    The cells are combined a stretch of days at a time (`GROUP_UNITS` units and the main tasks that meet
    those days), each stretch's finished cells written on: a job of thousands of units and millions of
    (day, series) cells holds one stretch's, and the per-day and per-series sums."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    if not job.state.get("diff"):
        return None
    table = planned_view(rt.load_table(spec.table), job.state)
    contract = Contract.from_table(table)
    columns = compared_columns(table.schema().as_arrow(), contract)
    units = rt.store.units(job_id) if units is None else units
    missing = [u.unit_id for u in units if u.status != "done"]
    if missing:
        raise BackfillError(f"job {job_id}: the diff needs every unit written; {len(missing)} are not (first: {missing[0]})")
    lo, hi = span if span is not None else (job.state["range_start"], job.state["range_end"])
    tasks = [(i, t) for i, t in enumerate(read_json(rt, job_id, MAIN_TASKS) or []) if t["start"] < hi and t["end"] > lo]
    days, series, samples = [], [], []
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, "diff", f"{scope}.parquet"))
    rt.objects.make_parent(fs, path)
    with fs.open_output_stream(path) as out, ThreadPoolExecutor(max_workers=reads_at_once(fs)) as pool:
        writer = None
        for first, last, group in _stretches(units, lo, hi):
            near = [i for i, t in tasks if t["start"] < last and t["end"] > first]
            main = _facts(pool, rt, job_id, "main", [main_task_name(i) for i in near])
            found = _facts(pool, rt, job_id, "units", [u.unit_id for u in group],
                           {u.unit_id for u in group if u.info.get("main_counted")})
            # main's cells of these days alone: a main task's span and a merge unit's partition (a month) may pass them
            cells = finish(_days(combine([c for c, _ in main + found], columns), first, last), columns, spec.mode)
            # a dictionary for the day and series alone: the writer tried one for every count and sum, nearly
            # all distinct, which took a third of its time (a merge job's 36,000 cells: 10 -> 7 ms, 17 % smaller)
            writer = writer or pq.ParquetWriter(out, cells.schema, compression="zstd", use_dictionary=["day", "series"])
            writer.write_table(cells)
            days.append(grouped(cells, "day", columns))
            series.append(grouped(cells, "series", columns))
            day = cells.column("day")  # a stretch's cells are its days times their series: their days once each
            after = {plain(d) for d in pc.unique(day.filter(pc.greater(cells.column("rows_after"), 0))).to_pylist()}
            shown = {plain(d) for d in pc.unique(day).to_pylist()}
            removed = [s for _, kept in main for s in kept.get("only_before", []) if s["day"] in shown and s["day"] not in after]
            samples.append(keep_samples([kept for _, kept in found] + [{"only_before": removed}]))
        if writer is not None:
            writer.close()
    summary = {"job_id": job_id, "table": spec.table, "mode": spec.mode, "scope": scope, "predicted": spec.dry_run,
               "reason": spec.reason, "key": list(contract.dedup_key), "series_key": list(contract.series_key),
               "columns": columns, "range": {"start": iso(lo), "end": iso(hi)},
               **summarize(grouped(days, "day", columns), grouped(series, "series", columns), columns, keep_samples(samples))}
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, "diff", f"{scope}.json"))
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(summary).encode())
    if scope == "canary":
        rt.store.update_job(job_id, diff_canary=_brief(summary))
    else:
        rt.store.update_job(job_id, diff_job=_brief(summary))
    return summary


GROUP_UNITS = 1000  # units whose cells are combined at once


def _stretches(units: list[UnitRecord], lo: int, hi: int) -> list[tuple[int, int, list[UnitRecord]]]:
    """[lo, hi) cut into stretches of whole days, each with the units that start in it, at most about
    `GROUP_UNITS` of them: a cut falls only between days (so a day's cells are combined in one stretch)
    and between partitions (a partition's units stay together)."""
    ordered = sorted(units, key=lambda u: (u.info["start"], u.unit_id))
    cuts, count = [lo], 0
    for before, unit in zip([None, *ordered[:-1]], ordered, strict=True):  # each unit with the one before it
        edge = max(unit.info["start"], lo)
        if before is not None and count >= GROUP_UNITS and edge % US_PER_DAY == 0 and edge > cuts[-1] \
                and unit.info["start"] >= before.info["end"]:
            cuts.append(edge)
            count = 0
        count += 1
    cuts.append(hi)
    stretches = []
    for first, last in pairwise(cuts):
        group = [u for u in ordered if first <= max(u.info["start"], lo) < last]
        stretches.append((first, last, group))
    return stretches


def _facts(pool: ThreadPoolExecutor, rt: Runtime, job_id: str, kind: str, names: list[str],
           counted: set[str] | None = None) -> list[tuple[pa.Table, dict[str, list[dict[str, Any]]]]]:
    """The cells and samples of main tasks or units, read many at once; one missing is an error. A unit
    named in ``counted`` (merge mode: the cut took its count of main's rows) brings that count along, from
    its own facts or, written by an engine that kept it apart, from its ``local`` facts."""
    counted = counted or set()
    found = list(pool.map(lambda name: read_facts(facts_uri(rt, job_id, kind, name), objects=rt.objects,
                                                  before=name in counted), names))
    lost = [name for name, facts in zip(names, found, strict=True) if facts is None]
    if lost:
        raise BackfillError(f"job {job_id}: the diff's facts of {len(lost)} {'main task' if kind == 'main' else 'unit'}(s) "
                            f"are missing (first: {lost[0]}); resume the job")
    apart = [name for name, facts in zip(names, found, strict=True) if facts is not None and name in counted and not facts[2]]
    return [(cells, samples) for cells, samples, _ in (f for f in found if f is not None)] + (
        _facts(pool, rt, job_id, "local", apart) if apart else [])


def _days(cells: pa.Table, first: int, last: int) -> pa.Table:
    """The cells of the days of [first, last)."""
    day = cells.column("day")
    return cells.filter(pc.and_(pc.greater_equal(day, first // US_PER_DAY), pc.less_equal(day, (last - 1) // US_PER_DAY)))


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    """What the job record keeps of a diff (a store item stays small): its totals and columns."""
    return {k: summary[k] for k in ("scope", "predicted", "range", "totals", "by_column")}


def load(rt: Runtime, job_id: str, scope: str | None = None) -> tuple[dict[str, Any], pa.Table | None] | None:
    """A job's diff: its summary and cells (None when the cells are gone: the staging area expired, and the
    summary came from ``timelake.backfills``), the whole job's if there is one, else its canary's; None
    when the job has none (yet)."""
    for name in ((scope,) if scope else SCOPES):
        fs, path = rt.objects.filesystem(rt.staging_path(job_id, "diff", f"{name}.json"))
        try:
            with fs.open_input_stream(path) as handle:
                summary = json.loads(handle.read())
        except FileNotFoundError:
            continue
        fs, path = rt.objects.filesystem(rt.staging_path(job_id, "diff", f"{name}.parquet"))
        try:
            with fs.open_input_file(path) as handle:
                cells = pq.read_table(handle)
        except FileNotFoundError:
            cells = None
        return summary, cells
    return None


def drop_scratch(rt: Runtime, job_id: str) -> None:
    """The diff's scratch files, once its result is written: the main tasks, main's rows they spilled and
    each task's and unit's cells."""
    for kind in ("main", "units", "local"):
        fs, path = rt.objects.filesystem(rt.staging_path(job_id, "diff", kind))
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(path)
    for name in (MAIN_TASKS, LOCAL):
        fs, path = rt.objects.filesystem(rt.staging_path(job_id, name))
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(path)


def finish_dry_run(rt: Runtime, job_id: str) -> dict[str, Any] | None:
    """A dry run's end, once its units have counted (and written nothing): its predicted diff, and the
    counts its report shares with a run's, taken from the units; every scratch file goes but the diff."""
    summary = conclude(rt, job_id)
    job = rt.store.get_job(job_id)
    units = rt.store.units(job_id)
    conflicts = sum(u.result.get("rows_conflicting_existing", 0) for u in units)
    overlap = summary["totals"]["in_both"] if summary is not None and job.spec["mode"] == "replace" else conflicts
    drop_scratch(rt, job_id)
    clear_staging(rt, job_id, keep="diff")
    rt.store.update_job(job_id, Phase.DRY_RUN_COMPLETE, overlap_existing_rows=overlap,
                        rows_duplicate_in_source=sum(u.result.get("rows_duplicate_in_source", 0) for u in units))
    return summary


def find(rt: Runtime, job_id: str) -> tuple[dict[str, Any], pa.Table | None]:
    """A job's diff, wherever it is: beside its scratch files (the whole job's, else its canary day's), else
    its summary in ``timelake.backfills`` (the staging area of a published job may have expired). Raises,
    saying why, for a job that has none."""
    from timelake.followup.provenance import history

    job = rt.store.get_job(job_id)
    found = load(rt, job_id)
    if found is not None:
        return found
    rows = [r for r in history(rt, job.table).to_pylist() if r["job_id"] == job_id and r.get("diff")]
    if rows:
        return json.loads(rows[0]["diff"]), None
    spec = JobSpec.model_validate(job.spec)
    if spec.mode == "append":
        raise BackfillError(f"job {job_id} appends rows without looking at main's (mode append): it has no diff")
    if not spec.diff:
        raise BackfillError(f"job {job_id} ran without a diff (diff: false)")
    raise BackfillError(f"job {job_id} has no diff yet ({job.phase}): it is known once every unit is written "
                        f"(a canary's day once the canary waits); follow the job with: timelake backfill status {job_id}")
