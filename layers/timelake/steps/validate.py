"""Validate the staged data on the branch before anything reaches main.

Counts, bounds and null counts come from the manifests (no data read). Sortedness, key uniqueness,
the overlap with main and the per-partition aggregate come from ONE parallel pass over the staged
files that reads only the key and value columns: files are sorted and partitions disjoint, so
uniqueness is an adjacent comparison within a file plus disjoint series sets between the files of a
partition, linear in rows. User assertions run in DuckDB with external access disabled. A failed
check stops the job: main is untouched and the branch stays for inspection.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile

from timelake.errors import ValidationFailed
from timelake.model.commit import footer_statistics, staged_files
from timelake.model.contract import Contract
from timelake.model.diff import decoded_columns, series_labels
from timelake.model.layout import PartitionKey, SnapshotRange, int_from_bytes, micros, run_starts_within, single_array
from timelake.model.lineage import Lineage, Origin, PlanMark, planned_view
from timelake.model.spec import JobSpec
from timelake.model.timeutil import iso
from timelake.ports.files import ObjectIO, reads_at_once
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobState, Phase
from timelake.steps import rejects
from timelake.steps.plan import job_table, read_json, write_json
from timelake.steps.redo import require_branch
from timelake.steps.spill import is_text
from timelake.steps.write import KeyCodes, KeyPacker, existing_mask, in_order, meets, met, packed_series, sort_key_codes

if TYPE_CHECKING:
    import duckdb

SAMPLES = 5
BATCH_ROWS = 1 << 20  # a check holds one batch of a file's key and value columns, whatever the file's size
CHECK_ITEMS = "validate/files.json"
ASSERTION_MEMORY = "2GB"  # DuckDB memory_limit for user assertions: a runaway query fails instead of the process
LAMBDA_MEMORY = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"  # MB, set by Lambda: there the assertions get half of it


@dataclass
class Check:
    name: str
    passed: bool
    detail: str
    blocking: bool = True
    samples: list[dict[str, Any]] = field(default_factory=list)


def validate(rt: Runtime, job_id: str) -> dict[str, Any]:
    """Validate step. Input: job id. Output: the checks; raises ValidationFailed if a blocking one failed."""
    job = rt.store.get_job(job_id)
    require_branch(rt, job_id, job_table(rt, job), job.state)
    checks = run_checks(rt, job.spec, rt.store.units(job_id), job.state, job_id)
    return conclude(rt, job_id, checks, Phase.VALIDATED, job.state["branch"])


def plan_checks(rt: Runtime, job_id: str) -> dict[str, Any]:
    """Validation, first part: fixes the snapshots of main every staged file is compared with, and lists
    the staged files as work items for `check_file` (the writer pool embedded, a Distributed Map on AWS)."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    table = job_table(rt, job)
    require_branch(rt, job_id, table, job.state)
    staged = staged_files(table, job.state)
    snapshots = _main_views(table, spec.mode, job.state, bool(staged))
    rt.store.update_job(job_id, validation_snapshots=snapshots)
    items = [{"job_id": job_id, "file": f.file_path, "spec_id": f.spec_id, "partition": f.partition[0]} for f in staged]
    return {"job_id": job_id, "files": len(items), "manifest": write_json(rt, job_id, CHECK_ITEMS, items)}


def check_items(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    """The work items `plan_checks` listed."""
    return read_json(rt, job_id, CHECK_ITEMS) or []


def unchecked(rt: Runtime, job_id: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items among ``items`` whose file has no facts yet against the snapshots `plan_checks` fixed:
    those checked beside the stage commit (`early_checks`) are not checked again while main stays put."""
    snapshots = rt.store.get_job(job_id).state.get("validation_snapshots")
    if snapshots is None or not items:
        return items
    found = _stored_many(rt, job_id, snapshots, [item["file"] for item in items])
    return [item for item, facts in zip(items, found, strict=True) if facts is None]


def early_checks(rt: Runtime, job_id: str) -> tuple[CheckContext, list[dict[str, Any]]] | None:
    """The per-file checks of a job whose units are all written, to run while stage commits their files
    to the branch: they read the files themselves, which the commit does not change, against the
    snapshots of main `plan_checks` will fix after it (main's current one: the commit is to the branch),
    and keep their facts under those snapshots. A live commit to main meanwhile changes the snapshots
    and so the facts' names: validation then checks those files again. None when no file was written."""
    job = rt.store.get_job(job_id)
    written = [u.result for u in rt.store.units(job_id) if u.status == "done" and u.result.get("path")]
    if not written:
        return None
    table = job_table(rt, job)
    views = _main_views(table, JobSpec.model_validate(job.spec).mode, job.state, True)
    context = CheckContext({**job.state, "validation_snapshots": views}, table, Contract.from_table(table), rt.objects, {},
                           job_id=job_id)
    return context, [{"job_id": job_id, "file": r["path"], "spec_id": r["spec_id"], "partition": r["value"]} for r in written]


@dataclass(frozen=True)
class CheckContext:
    """What every per-file check of a job reads first: the job's state, its table and contract. Checks
    on threads of one process share it, so the job record and the table's metadata are read and
    parsed once, not once per file while the other checks wait for the interpreter; and main is planned
    once per snapshot over the job's range (``shared``), as the writers share `layout.MainReader`. A
    check on its own (a Lambda) plans main over its file's partition only."""

    state: JobState
    table: Any
    contract: Contract
    objects: ObjectIO
    plans: dict[str, SnapshotRange] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False)
    job_id: str = ""

    @classmethod
    def of(cls, rt: Runtime, job_id: str, shared: bool = False) -> CheckContext:
        job = rt.store.get_job(job_id)
        table = job_table(rt, job)
        return cls(job.state, table, Contract.from_table(table), rt.objects, {} if shared else None, job_id=job_id)

    def mains(self, lo: int, hi: int) -> dict[str, SnapshotRange]:
        """Main's snapshots a file of partition [lo, hi) is checked against, planned. Planning is pyiceberg
        reading manifests under the interpreter lock: per file it was most of a merge job's validation."""
        if self.plans is None:
            return self._plan(lo, hi)
        with self.lock:  # a staged key lies in the job's range: main is planned over it, files read per partition
            if not self.plans:
                self.plans.update(self._plan(self.state["range_start"], self.state["range_end"]))
            return self.plans

    def _plan(self, lo: int, hi: int) -> dict[str, SnapshotRange]:
        return _planned_views(self.table, self.contract, self.state, self.job_id, self.state["validation_snapshots"], lo, hi,
                              objects=self.objects)


def check_file(rt: Runtime, job_id: str, file: str, spec_id: int, partition: int,
               context: CheckContext | None = None) -> dict[str, Any]:
    """Validation, per staged file: one pass over its key and value columns, a batch at a time (sortedness,
    duplicates, overlap with main in its partition, its check sum), kept beside the job's scratch files
    for `validate` to combine. A work item holds one file's columns, whatever the job's size."""
    context = context or CheckContext.of(rt, job_id)
    lo, hi = _partition_range(context.contract, spec_id, partition)
    facts = _file_facts(context.contract, context.state, context.mains(lo, hi), file, spec_id, partition, objects=rt.objects)
    _store_facts(rt, job_id, context.state["validation_snapshots"], facts)
    return {"file": file, "passed": facts.unsorted_at is None and not facts.duplicate_count and not facts.overlap.get("base")}


def run_checks(rt: Runtime, job_spec: dict[str, Any], units: list[Any], state: JobState,
               job_id: str | None = None) -> list[Check]:
    """Every check over the files ``state["staged_snapshot_id"]`` added, against ``units`` and the
    counts in ``state``: the whole job, or (with a narrowed state) one canary day of it. With ``job_id``,
    the per-file facts that `check_file` stored are used; a file without them is checked here."""
    spec = JobSpec.model_validate(job_spec)
    table = planned_view(rt.load_table(spec.table), state)
    contract = Contract.from_table(table)
    staged = staged_files(table, state)
    totals = _unit_totals(units)

    footers = _footers(table, contract, staged, objects=rt.objects)
    checks = [
        _row_balance(state, totals, staged),
        _files_match_units(units, staged),
        _time_bounds(table, contract, staged, state["range_start"], state["range_end"], footers),
        _not_null(table, contract, staged, footers),
    ]
    facts = _scan_files(rt, job_id, table, contract, staged, spec.mode, state)
    checks += [_sorted(facts), _unique_keys(facts, contract)]
    checks += _overlap_with_main(facts, table, spec.mode, state)
    checks.append(_aggregate(units, facts, state))
    if (budget := rejects.check(state)) is not None:
        checks.append(Check(**budget))
    if spec.assertions:
        con = _staged_connection(staged, objects=rt.objects)
        try:
            checks.extend(_assertions(con, spec.assertions, table.schema().as_arrow(), bool(staged), spec.assertion_timeout))
        finally:
            con.close()
    return checks


def conclude(rt: Runtime, job_id: str, checks: list[Check], passed_phase: Phase, branch: str) -> dict[str, Any]:
    """Record the checks; on a blocking failure stop the job (lease released, branch kept for inspection)."""
    report = [asdict(c) for c in checks]
    failed = [c for c in checks if c.blocking and not c.passed]
    if failed:
        rt.store.update_job(job_id, Phase.FAILED_VALIDATION, checks=report, error="; ".join(f"{c.name}: {c.detail}" for c in failed))
        rt.store.release_lease(job_id)
        raise ValidationFailed(
            f"job {job_id}: validation failed ({', '.join(c.name for c in failed)}): {failed[0].detail}; "
            f"nothing was published, the staged data stays on branch {branch}"
        )
    rt.store.update_job(job_id, passed_phase, checks=report)
    return {"job_id": job_id, "passed": True, "checks": len(checks)}


def _unit_totals(units: list[Any]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for u in units:
        for key in ("rows_written", "rows_duplicate_in_source", "rows_conflicting_existing"):
            totals[key] += u.result.get(key, 0)
    return totals


def _row_balance(state: JobState, totals: dict[str, float], staged: list[DataFile]) -> Check:
    source = state["rows_in_source"]
    rejected = sum(state["rows_rejected"].values())
    staged_rows = sum(f.record_count for f in staged)
    accounted = (
        staged_rows + totals["rows_duplicate_in_source"] + totals["rows_conflicting_existing"]
        + rejected + state["rows_outside_range"] + state["rows_outside_retention"]
    )
    detail = (
        f"source {source} = staged {staged_rows} + duplicates {int(totals['rows_duplicate_in_source'])} "
        f"+ conflicts {int(totals['rows_conflicting_existing'])} + rejected {rejected} "
        f"+ outside range {state['rows_outside_range']} + outside retention {state['rows_outside_retention']}"
        f" (= {int(accounted)})"
    )
    return Check("row_count_balance", source == accounted and staged_rows == totals["rows_written"], detail)


def _files_match_units(units: list[Any], staged: list[DataFile]) -> Check:
    expected = {u.result["path"]: u.result["rows_written"] for u in units if u.result.get("path")}
    actual = {f.file_path: f.record_count for f in staged}
    wrong = [p for p in expected.keys() | actual.keys() if expected.get(p) != actual.get(p)]
    detail = f"{len(actual)} staged file(s), one per written unit" if not wrong else f"{len(wrong)} file(s) differ from the unit records, e.g. {wrong[0]}"
    return Check("staged_files_match_units", not wrong, detail, samples=[{"file": p} for p in wrong[:SAMPLES]])


def _required(table: Any, contract: Contract) -> dict[str, int]:
    """The columns no row may leave null, and their field ids: the schema's required ones, time and series."""
    schema = table.schema()
    names = {f.name for f in schema.fields if f.required} | {contract.time_column, *contract.series_key}
    return {name: schema.find_field(name).field_id for name in sorted(names)}


def _footers(table: Any, contract: Contract, staged: list[DataFile], *, objects: ObjectIO) -> dict[str, dict[str, Any]]:
    """The footer statistics (`commit.footer_statistics`) of the staged files whose manifest entries lack the
    time column's bounds or a required column's null count: a table whose metrics modes keep them out of its
    manifests (``write.metadata.metrics.default=counts`` on a wide table, ``none`` on a column) is checked on
    what its files hold, as it is when the entries carry them."""
    time_id = table.schema().find_field(contract.time_column).field_id
    ids = _required(table, contract).values()
    lacking = [f.file_path for f in staged
               if time_id not in (f.lower_bounds or {}) or time_id not in (f.upper_bounds or {})
               or any(i not in (f.null_value_counts or {}) for i in ids)]
    if not lacking:
        return {}
    at_once = min(reads_at_once(objects.filesystem(lacking[0])[0]), len(lacking))
    if at_once == 1:
        return {path: footer_statistics(table, path, objects=objects) for path in lacking}
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        return dict(zip(lacking, pool.map(lambda path: footer_statistics(table, path, objects=objects), lacking),
                        strict=True))


def _stat(f: DataFile, key: str, field_id: int, footers: dict[str, dict[str, Any]]) -> Any:
    """A statistic of a staged file's column: its manifest entry's, else its footer's (`_footers`); None if neither has it."""
    found = (getattr(f, key) or {}).get(field_id)
    return found if found is not None else (footers.get(f.file_path, {}).get(key) or {}).get(field_id)


def _time_bounds(table: Any, contract: Contract, staged: list[DataFile], start: int, end: int,
                 footers: dict[str, dict[str, Any]]) -> Check:
    field = table.schema().find_field(contract.time_column)
    transforms = {t.spec_id: t.transform for t in contract.tiers}
    bad = []
    for f in staged:
        lo, hi = (None if raw is None else int_from_bytes(field.field_type, raw)
                  for raw in (_stat(f, "lower_bounds", field.field_id, footers), _stat(f, "upper_bounds", field.field_id, footers)))
        p_lo, p_hi = PartitionKey(f.spec_id, transforms[f.spec_id], f.partition[0]).range
        if lo is None or hi is None or lo < max(start, p_lo) or hi >= min(end, p_hi):
            bad.append({"file": f.file_path, "min": iso(lo), "max": iso(hi), "partition": [iso(p_lo), iso(p_hi)]})
    detail = (
        f"every file within [{iso(start)}, {iso(end)}) and its partition" if not bad
        else f"{len(bad)} file(s) hold times outside the job range or their partition, or none that tell"
    )
    return Check("time_bounds", not bad, detail, samples=bad[:SAMPLES])


def _not_null(table: Any, contract: Contract, staged: list[DataFile], footers: dict[str, dict[str, Any]]) -> Check:
    bad, unknown = [], []
    required = _required(table, contract)
    for name, field_id in required.items():
        counts = [_stat(f, "null_value_counts", field_id, footers) for f in staged]
        if nulls := sum(c for c in counts if c is not None):
            bad.append({"column": name, "nulls": nulls})
        unknown += [{"column": name, "file": f.file_path} for f, c in zip(staged, counts, strict=True) if c is None]
    if bad:
        return Check("required_not_null", False, f"nulls in required column(s): {bad}", samples=bad)
    if unknown:
        return Check("required_not_null", False, f"{len(unknown)} file column(s) with no null count in their manifest "
                     "entry or footer", samples=unknown[:SAMPLES])
    return Check("required_not_null", True, f"no nulls in {', '.join(required)}")


def _staged_connection(staged: list[DataFile], *, objects: ObjectIO) -> duckdb.DuckDBPyConnection:
    """DuckDB with a view ``staged`` over the staged files and no access to anything else."""
    import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
    con = duckdb.connect()
    if staged:
        fs, _ = objects.filesystem(staged[0].file_path)
        dataset = ds.dataset([objects.filesystem(f.file_path)[1] for f in staged], filesystem=fs, format="parquet")
        con.register("staged", dataset)
    con.execute("SET enable_external_access = false")
    con.execute(f"SET memory_limit = '{assertion_memory()}'")
    con.execute("SET lock_configuration = true")
    return con


def assertion_memory() -> str:
    """DuckDB's memory limit for the user's assertions: half a Lambda's memory, so that a query that
    would need more fails the check instead of the function; ``ASSERTION_MEMORY`` elsewhere."""
    lambda_mb = os.environ.get(LAMBDA_MEMORY)
    return f"{int(lambda_mb) // 2}MB" if lambda_mb else ASSERTION_MEMORY


@dataclass
class _FileFacts:
    """What one pass over a staged file's key and value columns shows."""

    path: str
    partition: tuple[int, int]
    range: tuple[int, int]
    unsorted_at: int | None
    duplicates: list[dict[str, Any]]
    duplicate_count: int
    series: pa.Array
    check_sum: float
    overlap: dict[str, int]
    overlap_samples: dict[str, list[dict[str, Any]]]

    def to_json(self) -> dict[str, Any]:
        """Field by field: ``dataclasses.asdict`` deep-copies every value, the series array through a
        pickle, which made this most of a small file's check, holding the interpreter."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "series": pc.cast(self.series, pa.string()).to_pylist()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _FileFacts:
        return cls(**{**data, "partition": tuple(data["partition"]), "range": tuple(data["range"]),
                      "series": pa.array(data["series"], pa.string())})


def _main_views(table: Any, mode: str, state: JobState, any_staged: bool) -> dict[str, dict[str, Any]]:
    """The parts of main a staged key must not be on, each as main's current snapshot and the origins of
    its files (`lineage`): rows that were there at the plan ("base"; a key there is a failed check in
    merge mode) and, in merge mode, rows other writers added since ("live": reported, they win at
    publish). None in replace mode, which replaces the range. Told from the files main holds now, so
    another engine's expiry of the plan's snapshot changes nothing."""
    current = table.current_snapshot()
    if mode == "replace" or not any_staged or current is None:
        return {}
    views = {"base": {"snapshot_id": current.snapshot_id, "origins": [Origin.PLAN.value]}}
    mark = PlanMark.of(state, table)
    if mode == "merge" and current.snapshot_id != mark.snapshot_id and (current.sequence_number or 0) >= mark.sequence_number:
        views["live"] = {"snapshot_id": current.snapshot_id, "origins": [Origin.LIVE.value, Origin.REWRITE.value]}
    return views


def _planned_views(table: Any, contract: Contract, state: JobState, job_id: str | None,
                   views: dict[str, dict[str, Any]], lo: int, hi: int, *, objects: ObjectIO) -> dict[str, SnapshotRange]:
    lineage = Lineage(table, PlanMark.of(state, table), job_id or "")
    return {name: SnapshotRange(table, contract.time_column, lo, hi, contract.dedup_key, snapshot_id=view["snapshot_id"],
                                keep=lineage.accepts(view["origins"]), objects=objects)
            for name, view in views.items()}


def _partition_range(contract: Contract, spec_id: int, partition: int) -> tuple[int, int]:
    transforms = {t.spec_id: t.transform for t in contract.tiers}
    return PartitionKey(spec_id, transforms[spec_id], partition).range


def _facts_uri(rt: Runtime, job_id: str, snapshots: dict[str, Any], path: str) -> str:
    """Where `check_file` keeps a file's facts; the snapshots of main they were taken against are part of
    the name, so facts taken before a live commit are not reused after it."""
    digest = hashlib.sha256(json.dumps([path, snapshots], sort_keys=True).encode()).hexdigest()[:24]
    return rt.staging_path(job_id, "validate", f"{digest}.json")


def _store_facts(rt: Runtime, job_id: str, snapshots: dict[str, Any], facts: _FileFacts) -> None:
    fs, path = rt.objects.filesystem(_facts_uri(rt, job_id, snapshots, facts.path))
    rt.objects.make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(facts.to_json()).encode())


def _stored_many(rt: Runtime, job_id: str, snapshots: dict[str, Any], paths: list[str]) -> list[_FileFacts | None]:
    """`_stored_facts` of each of ``paths``: one small object a file, read many at once, their latency (not
    their size) is the cost."""
    with ThreadPoolExecutor(max_workers=reads_at_once(rt.objects.filesystem(rt.staging_path(job_id))[0])) as pool:
        return list(pool.map(lambda path: _stored_facts(rt, job_id, snapshots, path), paths))


def _stored_facts(rt: Runtime, job_id: str, snapshots: dict[str, Any], path: str) -> _FileFacts | None:
    """A file's stored facts, or None where there are none to trust: never written, or written only in part
    (a process killed or a disk filled while it wrote them), which the file's check then takes again."""
    fs, local = rt.objects.filesystem(_facts_uri(rt, job_id, snapshots, path))
    try:
        with fs.open_input_stream(local) as handle:
            return _FileFacts.from_json(json.loads(handle.read()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):  # JSON cut short, or fields missing from it
        return None


def _scan_files(rt: Runtime, job_id: str | None, table: Any, contract: Contract, staged: list[DataFile], mode: str,
                state: JobState) -> list[_FileFacts]:
    """The facts of every staged file: those `check_file` stored (against the same snapshots of main),
    the others computed here, a few files at a time, main planned once over the job's range."""
    planned = state.get("validation_snapshots") if job_id else None
    snapshots = planned if planned is not None else _main_views(table, mode, state, bool(staged))
    found: dict[str, _FileFacts | None] = {}
    if job_id:
        paths = [f.file_path for f in staged]
        found = dict(zip(paths, _stored_many(rt, job_id, snapshots, paths), strict=True))
    missing = [f for f in staged if found.get(f.file_path) is None]
    mains = _planned_views(table, contract, state, job_id, snapshots, state["range_start"], state["range_end"],
                           objects=rt.objects) if missing else {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        computed = dict(zip([f.file_path for f in missing], pool.map(
            lambda f: _file_facts(contract, state, mains, f.file_path, f.spec_id, f.partition[0], objects=rt.objects), missing),
            strict=True))
    return [found.get(f.file_path) or computed[f.file_path] for f in staged]


def _file_facts(contract: Contract, state: JobState, mains: dict[str, SnapshotRange], file: str, spec_id: int,
                partition: int, *, objects: ObjectIO) -> _FileFacts:
    """One pass over a staged file's key and value columns, one batch at a time. With the usual key
    (series, time), the file's keys are packed as it goes (8 bytes a row) and main's rows in the partition
    are then matched against them a batch at a time; a file read in one batch and in order (a day's) keeps
    its sort codes instead, which main's rows meet (`write.met`). Other keys hold main's partition (`_Near`)."""
    keys = list(contract.dedup_key)
    check = state.get("check_column")
    columns = keys + ([check] if check and check not in keys else [])
    lo, hi = _partition_range(contract, spec_id, partition)
    facts = _FileFacts(path=file, partition=(spec_id, partition), range=(lo, hi), unsorted_at=None,
                       duplicates=[], duplicate_count=0, series=pa.array([], pa.string()), check_sum=0.0,
                       overlap={name: 0 for name in mains}, overlap_samples={name: [] for name in mains})
    last: dict[str, Any] | None = None
    offset = 0
    fs, path = objects.filesystem(file)
    with fs.open_input_file(path) as handle:
        stored = pq.read_metadata(handle)
        schema = stored.schema.to_arrow_schema()
        text = [n for n in contract.series_key if n in schema.names and is_text(schema.field(n).type)]
        parquet = pq.ParquetFile(handle, metadata=stored, read_dictionary=text or None)  # codes, not a string a row
        series = packed_series(contract)
        # with the usual key the file's keys are packed (8 bytes a row) to match main's against; the pass
        # keeps each row's time and series code and packs them once it has seen all the series (which fit
        # beside the partition's times: there are at most as many as rows), so the series column is read once.
        # Only when that bound does not fit are the series read before the pass. A key of several columns is
        # collected as their values joined: the files of a partition share no series, not no value of its first column
        first_series = contract.series_key[0] if contract.series_key else None
        several = len(contract.series_key) > 1 and set(contract.series_key) <= set(columns)
        deferred = bool(mains and series) and KeyPacker.room(lo, hi - 1, parquet.metadata.num_rows)
        early = first_series is not None and not several and (
            (bool(mains and series) and not deferred) or first_series not in columns)
        if early and first_series is not None:
            facts.series = _distinct(parquet, first_series)
        seen: list[pa.Array] = []
        held: list[pa.ChunkedArray] = []  # deferred: each batch's series column, as codes where it is text
        packer = KeyPacker.fit(series, contract.time_column, facts.series, lo, hi - 1) if mains and series and not deferred else None
        packed = np.empty(parquet.metadata.num_rows, dtype=np.int64) if packer is not None or deferred else None  # every row set below
        whole: KeyCodes | None = None  # a file read in one batch, in order: its sort codes, which main's rows meet
        nears = ({name: _Near(main.batches(lo, hi).read_all(), contract) for name, main in mains.items()}
                 if packer is None and not deferred else {})
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False):
            rows = pa.Table.from_batches([batch])
            codes = sort_key_codes(rows, contract)
            unsorted_at, dup_mask = in_order(codes.columns)
            if several:
                seen.append(series_labels(rows, contract.series_key)[1])
            elif first_series is not None and not early:
                seen.append(_present(rows.column(first_series), codes, first_series, unsorted_at is None))
            first = {k: rows.column(k)[0].as_py() for k in keys}
            if last is not None:  # the batches' seam: the previous batch's last key against this one's first
                seam = tuple(last[k] for k in keys), tuple(first[k] for k in keys)
                if seam[0] > seam[1] and facts.unsorted_at is None:
                    facts.unsorted_at = offset
                if seam[0] == seam[1]:
                    facts.duplicate_count += 1
                    facts.duplicates.append(_fmt_row(last))
            if unsorted_at is not None and facts.unsorted_at is None:
                facts.unsorted_at = offset + unsorted_at
            if dup_mask.any():
                dups = rows.select(keys).filter(pa.array(dup_mask))
                facts.duplicate_count += dups.num_rows
                facts.duplicates += [_fmt_row(r) for r in dups.slice(0, SAMPLES).to_pylist()]
            if packer is not None and packed is not None:
                _place(packed, offset, rows.num_rows, packer.pack_rows(rows))
            elif deferred and series is not None and rows.num_rows == parquet.metadata.num_rows and unsorted_at is None \
                    and meets(codes, series):
                whole, deferred, packed = codes, False, None  # the file in one batch, in order: main meets its sort codes
            elif deferred and packed is not None and series is not None and rows.num_rows == len(packed) \
                    and (packer := _packed_codes(codes, series, contract.time_column, lo, hi, packed)) is not None:
                deferred = False  # the file in one batch, packed from its sort codes
            elif deferred and packed is not None and series is not None:
                held.append(rows.column(series))
                packed[offset:offset + rows.num_rows] = micros(rows, contract.time_column)
            for name, near in nears.items():
                hits = near.hits(rows, codes)
                facts.overlap[name] += hits.num_rows
                facts.overlap_samples[name] += [_fmt_row(r) for r in hits.slice(0, SAMPLES).to_pylist()]
            if check:
                facts.check_sum += float(pc.sum(rows.column(check)).as_py() or 0)
            last = {k: rows.column(k)[rows.num_rows - 1].as_py() for k in keys}
            offset += rows.num_rows
        time_type = parquet.schema_arrow.field(contract.time_column).type
        if several:
            facts.series = _sorted_distinct(seen, pa.string())
        elif first_series is not None and not early:
            facts.series = _sorted_distinct(seen, parquet.schema_arrow.field(first_series).type)
    if deferred and packed is not None and series is not None:
        packer = KeyPacker.fit(series, contract.time_column, facts.series, lo, hi - 1)
        assert packer is not None, "room() bounds the series by the rows"
        offset = 0
        for column in held:
            part = packed[offset:offset + len(column)]  # the rows' times until packed over them
            _place(packed, offset, len(column), packer.pack_keys(column, part, out=part))
            offset += len(column)
    if whole is not None and series is not None:
        for name, main in mains.items():
            found = met(whole, series, contract.time_column, main.batches(lo, hi, tuple(text)))  # series as codes
            facts.overlap[name] = int(np.count_nonzero(found))  # the usual answer, none, without listing them
            if facts.overlap[name]:
                hits = np.flatnonzero(found)[:SAMPLES]
                ranks, times = whole.columns[0][hits], whole.columns[1][hits]
                sample = pa.table({series: whole.distinct[series].take(pa.array(ranks)),
                                   contract.time_column: pa.array(times, pa.int64()).cast(time_type)})
                facts.overlap_samples[name] = [_fmt_row(r) for r in sample.to_pylist()]
    if packer is not None and packed is not None:
        for name, main in mains.items():
            hits = np.flatnonzero(packer.mark(packed, main.batches(lo, hi, tuple(text)), rare=True))  # series as codes
            facts.overlap[name] = len(hits)
            if not len(hits):  # the usual answer: no sample to build
                continue
            values, times = packer.unpack(packed[hits[:SAMPLES]])
            sample = pa.table({series: values, contract.time_column: pa.array(times, pa.int64()).cast(time_type)})
            facts.overlap_samples[name] = [_fmt_row(r) for r in sample.to_pylist()]
    facts.duplicates = facts.duplicates[:SAMPLES]
    facts.overlap_samples = {name: s[:SAMPLES] for name, s in facts.overlap_samples.items()}
    return facts


def _packed_codes(codes: KeyCodes, series: str, time_column: str, lo: int, hi: int, out: np.ndarray) -> KeyPacker | None:
    """A file read in one batch that `write.met` does not answer for (out of order, or without the compiled
    pass): its keys packed into ``out`` from the sort codes its order check took
    (the series' ranks among its sorted dictionary, the times), not looked up and copied again (1 ms of a
    merge job's check of a day's file). None, leaving it to the general pass, when a series is null, a
    dictionary value repeats or a time lies outside the partition [lo, hi)."""
    distinct = codes.distinct.get(series)
    if distinct is None or distinct.null_count or len(codes.columns) < 2:
        return None
    ranks, times = codes.columns[0], codes.columns[1]
    if ranks.dtype not in (np.int32, np.int64) or times.dtype != np.int64 or not len(times) \
            or int(times.min()) < lo or int(times.max()) >= hi:
        return None
    if len(distinct) > 1 and not pc.all(pc.less(distinct.slice(0, len(distinct) - 1), distinct.slice(1))).as_py():
        return None
    packer = KeyPacker.fit(series, time_column, distinct, lo, hi - 1)
    if packer is not None:
        packer.pack(ranks, times, out=out)
    return packer


def _place(packed: np.ndarray, offset: int, count: int, keys: tuple[np.ndarray, np.ndarray | None]) -> None:
    """A batch of ``count`` rows' packed keys (`KeyPacker.pack_rows`) into the file's array from ``offset``;
    a key outside the partition is -1 there: it matches nothing."""
    keyed, at = keys
    part = packed[offset:offset + count]
    if at is None:
        part[:] = keyed
    else:
        part[:] = -1
        part[at] = keyed


def _distinct(parquet: pq.ParquetFile, column: str) -> pa.Array:
    """A file's distinct values of one column, sorted and plain: one read of that column alone, a batch at a time."""
    seen = [_unique(batch.column(0)) for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=[column])]
    return _sorted_distinct(seen, parquet.schema_arrow.field(column).type)


def _sorted_distinct(seen: list[pa.Array], kind: pa.DataType) -> pa.Array:
    """The distinct values of a column's batches (each batch's own distinct values), sorted and plain."""
    return pc.unique(pa.chunked_array(seen)).sort() if seen else pa.array([], kind.value_type if pa.types.is_dictionary(kind) else kind)


def _present(column: pa.Array | pa.ChunkedArray, codes: KeyCodes, name: str, ordered: bool) -> pa.Array:
    """The distinct values of a batch's series column ``name``, whose sort codes are ``codes``. A batch in key
    order holds each series in one run of its rank: the values at the runs' starts (found by the compiled
    search, a few hundred) are its distinct values, where hashing every row's code took 1 ms of the audit of
    a day's file. Otherwise, and for a column with nulls, `_unique`."""
    distinct, ranks = codes.distinct.get(name), codes.columns[0] if codes.columns else None
    if ordered and distinct is not None and ranks is not None and ranks.dtype in (np.int32, np.int64) \
            and not column.null_count:
        starts = run_starts_within(ranks, len(distinct))
        if starts is not None:
            return distinct.take(pa.array(ranks[starts]))
    return _unique(column)


def _unique(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The distinct values of a column, plain even when it is read dictionary-encoded (found among its codes)."""
    values = single_array(column)
    if pa.types.is_dictionary(values.type):
        return values.dictionary.take(pc.unique(values.indices))
    return pc.unique(values)


class _Near:
    """Main's keys in one staged file's partition, sorted by series, so each batch of the (sorted) file is
    matched against the slice of them that holds its series only."""

    def __init__(self, rows: pa.Table, contract: Contract) -> None:
        self.contract = contract
        self.series = contract.series_key[0] if len(contract.series_key) == 1 else None
        self.ranks: np.ndarray | None = None
        if self.series is None or rows.num_rows == 0:
            self.rows, self.distinct = rows, None
            return
        self.distinct = pc.unique(rows.column(self.series)).sort()
        ranks = pc.index_in(rows.column(self.series), value_set=self.distinct).to_numpy(zero_copy_only=False)
        order = np.argsort(ranks, kind="stable")
        self.rows, self.ranks = rows.take(pa.array(order)), ranks[order]

    def hits(self, rows: pa.Table, codes: Any) -> pa.Table:
        """The keys of ``rows`` (a batch of a staged file) that main holds."""
        keys = list(self.contract.dedup_key)
        rows = decoded_columns(rows)
        near = self.rows
        if self.distinct is not None and self.ranks is not None and near.num_rows:
            mine_values = _unique(rows.column(self.series))
            mine = pc.index_in(mine_values, value_set=self.distinct.cast(mine_values.type))
            present = mine.drop_null().to_numpy(zero_copy_only=False)
            if not len(present):
                return rows.slice(0, 0).select(keys)
            lo, hi = np.searchsorted(self.ranks, present.min()), np.searchsorted(self.ranks, present.max(), side="right")
            near = near.slice(int(lo), int(hi - lo))
        if near.num_rows == 0:
            return rows.slice(0, 0).select(keys)
        return rows.select(keys).filter(pa.array(existing_mask(rows, near, self.contract, codes)))


def _sorted(facts: list[_FileFacts]) -> Check:
    bad = [{"file": f.path, "row": f.unsorted_at} for f in facts if f.unsorted_at is not None]
    detail = f"all {len(facts)} file(s) sorted by series key and time" if not bad else f"{len(bad)} file(s) out of order, e.g. {bad[0]}"
    return Check("files_sorted", not bad, detail, samples=bad[:SAMPLES])


def _unique_keys(facts: list[_FileFacts], contract: Contract) -> Check:
    """Within a file: adjacent keys differ (the file is sorted). Between files: the files of one
    partition hold disjoint series, and different partitions cover disjoint time ranges."""
    samples = [d for f in facts for d in f.duplicates][:SAMPLES]
    count = sum(f.duplicate_count for f in facts)
    by_partition: dict[tuple[int, int], list[_FileFacts]] = defaultdict(list)
    for f in facts:
        by_partition[f.partition].append(f)
    shared = []
    for partition, files in by_partition.items():
        if len(files) > 1:
            series = pa.chunked_array([pc.cast(f.series, pa.string()) for f in files], pa.string())
            if len(pc.unique(series)) != len(series):
                shared.append({"partition": partition, "files": [f.path for f in files]})
    spans = sorted(files[0].range for files in by_partition.values())
    overlapping = [{"ranges": [iso(a[0]), iso(b[0])]} for a, b in pairwise(spans) if b[0] < a[1]]
    passed = not count and not shared and not overlapping
    cols = ", ".join(contract.dedup_key)
    detail = (
        f"no duplicate ({cols}) in staged data" if passed
        else f"{count} duplicate key(s) within files, {len(shared)} partition(s) with a series in two files, "
        f"{len(overlapping)} overlapping partition range(s)"
    )
    return Check("unique_keys_in_staged", passed, detail, samples=samples + shared[:SAMPLES] + overlapping[:SAMPLES])


def _overlap_with_main(facts: list[_FileFacts], table: Any, mode: str, state: JobState) -> list[Check]:
    """Merge mode: no staged key may exist on main as the plan saw it (units drop those). Keys that live
    writers committed since are reported; publish re-checks them and the live rows win."""
    if mode == "replace":
        return [Check("no_overlap_with_main", True, "replace mode: the range on main is replaced in the publish commit")]
    if not facts:
        return [Check("no_overlap_with_main", True, "nothing staged")]
    at_base = sum(f.overlap.get("base", 0) for f in facts)
    samples = [s for f in facts for s in f.overlap_samples.get("base", [])][:SAMPLES]
    blocking = mode == "merge"
    detail = (
        "no staged key exists on main" if not at_base
        else f"{at_base} staged key(s) already exist on main" + ("" if blocking else " (append mode: reported, not enforced)")
    )
    checks = [Check("no_overlap_with_main", at_base == 0, detail, blocking=blocking, samples=samples)]
    if any("live" in f.overlap for f in facts):
        live = sum(f.overlap.get("live", 0) for f in facts)
        checks.append(Check(
            "live_overlap_since_plan", live == 0,
            f"{live} staged key(s) were committed by live writers since the plan; they win at publish", blocking=False,
            samples=[s for f in facts for s in f.overlap_samples.get("live", [])][:SAMPLES],
        ))
    return checks


def _aggregate(units: list[Any], facts: list[_FileFacts], state: JobState) -> Check:
    column = state.get("check_column")
    if not column:
        return Check("aggregate_matches_source", True, "the table has no numeric value column to sum")
    file_sums = {f.path: f.check_sum for f in facts}
    accounted: dict[str, float] = defaultdict(float)
    for u in units:
        r = u.result
        accounted[u.info["partition"]] += file_sums.get(r.get("path"), 0.0) + r["duplicate_sum"] + r["conflict_sum"]
    bad = []
    for partition, source_sum in state["partition_sums"].items():
        got = accounted.get(partition, 0.0)
        if abs(got - source_sum) > 1e-6 * max(1.0, abs(source_sum)):
            bad.append({"partition": partition, "source": source_sum, "staged_plus_dropped": got})
    detail = (
        f"sum({column}) per partition: source = staged + dropped in all {len(state['partition_sums'])} partition(s)"
        if not bad else f"sum({column}) differs in {len(bad)} partition(s), e.g. {bad[0]}"
    )
    return Check("aggregate_matches_source", not bad, detail, samples=bad[:SAMPLES])


def _assertions(con: duckdb.DuckDBPyConnection, assertions: list[str], schema: pa.Schema, any_staged: bool,
                timeout: float) -> list[Check]:
    """The user's SQL, bounded: all of it together gets ``timeout`` seconds (then DuckDB is interrupted and
    the check fails, so a runaway recursive CTE cannot hold the job's lease) and `assertion_memory`."""
    import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
    if assertions and not any_staged:
        con.register("staged", schema.empty_table())
    checks = []
    deadline = time.monotonic() + timeout
    for i, sql in enumerate(assertions, 1):
        name = f"assertion_{i}"
        shown = repr(sql) if len(sql) <= 200 else repr(sql[:200]) + "…"
        left = deadline - time.monotonic()
        timer = threading.Timer(max(left, 0), con.interrupt)
        timer.start()
        try:
            relation = con.sql(sql)
            rows = relation.to_arrow_table() if relation is not None else None
        except duckdb.Error as exc:
            why = (f"stopped after the assertion timeout of {timeout:g} s" if time.monotonic() >= deadline
                   else f"could not run: {str(exc).splitlines()[0]}")
            checks.append(Check(name, False, f"{shown} {why}"))
            if time.monotonic() >= deadline:
                break
            continue
        finally:
            timer.cancel()
        if rows is None:
            checks.append(Check(name, False, f"{shown} is not a query; give a SELECT that returns the failing rows"))
            continue
        failing = rows.num_rows
        samples = [_fmt_row(r) for r in rows.slice(0, SAMPLES).to_pylist()]
        detail = f"{shown}: 0 failing rows" if not failing else f"{shown}: {failing} failing row(s), e.g. {samples[0]}"
        checks.append(Check(name, failing == 0, detail, samples=samples))
    return checks


def _fmt_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}


