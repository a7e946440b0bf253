"""The diff of a replace or merge job (`timelake.model.diff`): the main tasks that read main's rows of the
job's range once, and the combine of every task's and unit's cells into the job's diff.

The main tasks run after the cut and before the units (a canary's before its units, the rest after
approval): each reads its files of main at the plan's snapshot, counts their rows per day and series
and, in replace mode, spills them by partition and series bucket exactly as the scan spills the
source's, so that each unit reads main's rows of its own slice and nothing else. `conclude` sums the
cells at the stage step (the whole job), for the canary (its day) and at the end of a dry run, which
runs the same tasks and units without writing any file into the table, so that it predicts the same
diff.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from timelake.errors import BackfillError
from timelake.model.contract import Contract
from timelake.model.diff import (
    SAMPLES, before_cells, combine, compared_columns, facts_uri, finish, keep_samples, mark_of, plain, read_facts,
    rows_at_plan, sample, series_labels, summarize, write_facts,
)
from timelake.model.layout import SnapshotRange, dense_unique, micros, partition_codes
from timelake.model.lineage import planned_view
from timelake.model.spec import JobSpec
from timelake.model.timeutil import US_PER_DAY, iso
from timelake.ports.files import filesystem, make_parent
from timelake.ports.runtime import Runtime
from timelake.ports.store import UnitRecord
from timelake.steps import spill
from timelake.steps.plan import LOCAL, MAIN_TASKS, clear_staging, context, main_spill_uri, read_json
from timelake.steps.scan import HELD_BYTES, series_bucket

FACT_READERS = 32  # facts files read at once when combining (thousands of small objects on S3)
SCOPES = ("job", "canary")


def main_task_name(task: int) -> str:
    return f"t{task:05d}"


def read_main(rt: Runtime, job_id: str, task: int) -> dict[str, Any]:
    """Main task. Input: job id and task number. Reads main's rows of the task's files and span at the
    plan's snapshot, a row group at a time; counts them per day and series, keeps a few per day, and in
    replace mode spills them for the units. Idempotent: its facts file, written last, marks it done."""
    uri = facts_uri(rt, job_id, "main", main_task_name(task))
    if _exists(uri):
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
    local = set(read_json(rt, job_id, LOCAL) or [])  # partitions whose unit reads main's rows itself
    lo, hi = definition["start"], definition["end"]
    files = set(definition["files"]) if definition["files"] is not None else None
    snapshot_id, keep = rows_at_plan(planned, mark_of(job.state), job_id, files, definition["rewrites"])
    reader = SnapshotRange(planned, contract.time_column, lo, hi, tuple(target.names), snapshot_id, keep)
    dictionaries = spill.Dictionaries(target, contract.series_key)
    out = None
    if spec.mode == "replace":  # created even when it stays empty: the units read every spill their partition lists
        fs, path = filesystem(main_spill_uri(rt, job_id, task))
        make_parent(fs, path)
        out = spill.SpillFile(main_spill_uri(rt, job_id, task), dictionaries, spill.join_bytes(contract.target_file_size))
    parts, samples, rows_read = [], [], 0
    per_day: dict[int, int] = {}
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
                buckets = series_bucket(rows, contract.series_key) if contract.series_key else None
                out.hold(dictionaries.code(rows), [(k.spec_id, k.value) for k in keys], codes, buckets, rows.nbytes)
                if out.held_bytes > HELD_BYTES:
                    out.flush()
            days = ts // US_PER_DAY
            series, labels = series_labels(rows, contract.series_key)
            parts.append(before_cells(rows, columns, contract, days, (series, labels)))
            samples += _first_of_days(rows, days, series, labels, per_day, contract, columns)
    except BaseException:
        if out is not None:
            out.discard()
        raise
    if out is not None:
        out.close()
    write_facts(uri, combine(parts, columns), {"only_before": samples})
    return {"job_id": job_id, "task": task, "rows": rows_read}


def _first_of_days(rows: pa.Table, days: np.ndarray, series: np.ndarray, labels: pa.Array, per_day: dict[int, int],
                   contract: Contract, columns: list[str]) -> list[dict[str, Any]]:
    """A few rows of each day the task has not kept enough of: the samples of a day the job removes whole."""
    present, index, _ = dense_unique(days)
    wanted = [i for i, d in enumerate(present.tolist()) if per_day.get(d, 0) < SAMPLES]
    found = []
    keys = list(contract.dedup_key)
    for i in wanted:
        day = int(present[i])
        at = np.flatnonzero(index == i)[:SAMPLES - per_day.get(day, 0)]
        per_day[day] = per_day.get(day, 0) + len(at)
        for i, row in zip(at.tolist(), rows.select(keys + columns).take(pa.array(at)).to_pylist()):
            found.append(sample({k: row[k] for k in keys}, contract.time_column, {c: row[c] for c in columns}, None,
                                labels[int(series[i])].as_py()))
    return found


def pending_main_tasks(rt: Runtime, job_id: str, span: tuple[int, int] | None = None) -> list[int]:
    """The main tasks not done yet (of those whose span meets ``span``, a canary's)."""
    job = rt.store.get_job(job_id)
    if not job.state.get("diff"):
        return []
    tasks = read_json(rt, job_id, MAIN_TASKS) or []
    wanted = [i for i, t in enumerate(tasks) if span is None or (t["start"] < span[1] and t["end"] > span[0])]
    with ThreadPoolExecutor(max_workers=FACT_READERS) as pool:
        done = list(pool.map(lambda i: _exists(facts_uri(rt, job_id, "main", main_task_name(i))), wanted))
    return [i for i, finished in zip(wanted, done) if not finished]


def _exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def conclude(rt: Runtime, job_id: str, scope: str = "job", units: list[UnitRecord] | None = None,
             span: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """The job's diff from the cells of its main tasks and units: of the whole job, or (``scope``
    "canary") of the canary's units and of main's rows in their ``span``. Kept as a summary (JSON) and
    its cells (Parquet) beside the job's scratch files; the report keeps the totals. None for a job
    without a diff."""
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
    tasks = [i for i, t in enumerate(read_json(rt, job_id, MAIN_TASKS) or [])
             if span is None or (t["start"] < span[1] and t["end"] > span[0])]
    uris = [facts_uri(rt, job_id, "main", main_task_name(i)) for i in tasks]
    with ThreadPoolExecutor(max_workers=FACT_READERS) as pool:
        main = list(pool.map(read_facts, uris))
        found = list(pool.map(lambda u: read_facts(facts_uri(rt, job_id, "units", u.unit_id)), units))
    lost = [uri for uri, facts in zip(uris, main) if facts is None]
    lost += [u.unit_id for u, facts in zip(units, found) if facts is None]
    if lost:
        raise BackfillError(f"job {job_id}: the diff's facts of {len(lost)} task(s) and unit(s) are missing "
                            f"(first: {lost[0]}); resume the job")
    before = [cells for cells, _ in main if cells is not None]
    if span is not None:
        first, last = span[0] // US_PER_DAY, (span[1] - 1) // US_PER_DAY
        before = [c.filter(pc.and_(pc.greater_equal(c.column("day"), first), pc.less_equal(c.column("day"), last)))
                  for c in before]
    cells = finish(combine(before + [cells for cells, _ in found if cells is not None], columns), columns, spec.mode)
    after_days = {plain(d) for d, n in zip(cells.column("day").to_pylist(), cells.column("rows_after").to_pylist()) if n}
    in_scope = {plain(d) for d in cells.column("day").to_pylist()}
    removed = [s for _, samples in main if samples is not None for s in samples.get("only_before", [])
               if s["day"] not in after_days and s["day"] in in_scope]
    samples = keep_samples([s for _, s in found if s is not None] + [{"only_before": removed}])
    summary = {"job_id": job_id, "table": spec.table, "mode": spec.mode, "scope": scope, "predicted": spec.dry_run,
               "reason": spec.reason, "key": list(contract.dedup_key), "series_key": list(contract.series_key),
               "columns": columns,
               "range": {"start": iso(span[0] if span else job.state["range_start"]),
                         "end": iso(span[1] if span else job.state["range_end"])},
               **summarize(cells, columns, samples)}
    _write_result(rt, job_id, scope, summary, cells)
    rt.store.update_job(job_id, **{f"diff_{scope}": _brief(summary)})
    return summary


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    """What the job record keeps of a diff (a store item stays small): its totals and columns."""
    return {k: summary[k] for k in ("scope", "predicted", "range", "totals", "by_column")}


def _write_result(rt: Runtime, job_id: str, scope: str, summary: dict[str, Any], cells: pa.Table) -> None:
    import pyarrow.parquet as pq

    fs, path = filesystem(rt.staging_path(job_id, "diff", f"{scope}.parquet"))
    make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        pq.write_table(cells, out, compression="zstd")
    fs, path = filesystem(rt.staging_path(job_id, "diff", f"{scope}.json"))
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(summary).encode())


def load(rt: Runtime, job_id: str, scope: str | None = None) -> tuple[dict[str, Any], pa.Table | None] | None:
    """A job's diff: its summary and cells (None when the cells are gone: the staging area expired, and the
    summary came from ``timelake.backfills``), the whole job's if there is one, else its canary's; None
    when the job has none (yet)."""
    import pyarrow.parquet as pq

    for name in ((scope,) if scope else SCOPES):
        fs, path = filesystem(rt.staging_path(job_id, "diff", f"{name}.json"))
        try:
            with fs.open_input_stream(path) as handle:
                summary = json.loads(handle.read())
        except FileNotFoundError:
            continue
        fs, path = filesystem(rt.staging_path(job_id, "diff", f"{name}.parquet"))
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
    for kind in ("main", "units"):
        fs, path = filesystem(rt.staging_path(job_id, "diff", kind))
        try:
            fs.delete_dir(path)
        except FileNotFoundError:
            pass
    for name in (MAIN_TASKS, LOCAL):
        fs, path = filesystem(rt.staging_path(job_id, name))
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass


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
    rt.store.update_job(job_id, "dry_run_complete", overlap_existing_rows=overlap,
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
