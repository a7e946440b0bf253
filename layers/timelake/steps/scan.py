"""Scan: read one task's run of source files, map them onto the table contract, count, and spill.

Tasks are scanned independently (a process pool here, a Distributed Map of Lambdas on AWS), so the
source is read once, in parallel, whatever its size. Each scan spills its in-scope rows, already
mapped and grouped by target partition, to Arrow IPC files, and writes its counts as one JSON result
next to them; the result's existence marks the task as done, which makes a re-run skip it.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from timelake.errors import DstRefused, InvalidJob
from timelake.model.contract import Contract
from timelake.model.diff import MainCounter, compared_columns, compares, facts_uri, write_facts
from timelake.model.faults import checkpoint
from timelake.model.issues import Issues
from timelake.model.layout import (
    RUN_ROWS, MainReader, PartitionKey, by_index, code_runs, dense_unique, gather, micros, partition_codes, read_range, run_starts,
    run_starts_within, run_width, series_hash, single_array, time_runs, unique_of_runs,
)
from timelake.model.report import Tally
from timelake.model.spec import JobSpec
from timelake.model.timeutil import US_PER_DAY
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import UnitRecord
from timelake.sources import throttle
from timelake.sources.base import CsvOptions, Source, open_source
from timelake.sources.mapping import Mapper, merge_examples
from timelake.sources.resolve import open_spec_source
from timelake.sources.wide import WideSource
from timelake.steps import spill
from timelake.steps.write import Compare, encoding, sorted_order, write_rows

HELD_BYTES = 32 << 20  # rows a scan holds before spilling them all (coded: about 20 bytes a row of three columns)
SAMPLE_ROWS = 1 << 15  # rows written to measure Parquet bytes per row: enough for the ratio, a few ms per task
COALESCE_ROWS = 1 << 18  # the rows of a source batch
# A partition whose rows all lie in the pieces of one scan task is written by that task itself (no spill, no
# write step): the task holds its rows until the last of those pieces is read, so at most this many a
# partition (the plan checks) and in all (the task spills the largest held partition beyond it).
DIRECT_MAX_ROWS = 1 << 23
SERIES_BUCKETS = 256  # rows per partition are counted per bucket of the series hash, so cut can balance slices
MAX_STATES = 200  # distinct states counted by name; more (a text column mapped as numbers) count as one
OTHER_STATES = "(other states)"


@dataclass
class PartitionStats:
    key: PartitionKey
    rows: int = 0
    nbytes: int = 0
    check_sum: float = 0.0
    spill: list[str] = field(default_factory=list)
    buckets: Counter = field(default_factory=Counter)
    spill_bytes: int = 0
    direct: dict[str, Any] | None = None  # the unit result, when the scan wrote the partition's file itself
    counting: np.ndarray | None = field(default=None, repr=False)  # rows per bucket while scanning, see add_buckets

    def add_buckets(self, counts: np.ndarray) -> None:
        """Count rows per series bucket: added up as an array while scanning (a batch of a file per
        device touches every partition), folded into ``buckets`` by `counted`."""
        if self.counting is None:
            self.counting = counts.astype(np.int64)  # a copy, added to in place from then on
        else:
            self.counting += counts

    def counted(self) -> None:
        if self.counting is not None:
            present = np.flatnonzero(self.counting)
            self.buckets.update(dict(zip(present.tolist(), self.counting[present].tolist(), strict=True)))
            self.counting = None


@dataclass
class ScanResult:
    """What a scan learns; results of several pieces merge into the job's totals."""

    rows_in_source: int = 0
    rejected: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    rows_outside_range: int = 0
    rows_outside_retention: int = 0
    min_us: int | None = None
    max_us: int | None = None
    days: Counter = field(default_factory=Counter)
    partitions: dict[PartitionKey, PartitionStats] = field(default_factory=dict)
    sample_rows: int = 0
    sample_bytes: int = 0
    overlap_existing_rows: int = 0
    dst_undetermined: list[str] = field(default_factory=list)
    duplicates_in_source: int = 0
    issues: Issues = field(default_factory=Issues)
    states: Counter = field(default_factory=Counter)
    issue_days: Counter = field(default_factory=Counter)

    @property
    def rows_in_scope(self) -> int:
        return sum(p.rows for p in self.partitions.values())

    def merge(self, other: ScanResult) -> None:
        self.rows_in_source += other.rows_in_source
        self.rejected.update(other.rejected)
        merge_examples(self.examples, other.examples)
        self.rows_outside_range += other.rows_outside_range
        self.rows_outside_retention += other.rows_outside_retention
        self.min_us = _min(self.min_us, other.min_us)
        self.max_us = _max(self.max_us, other.max_us)
        self.days.update(other.days)
        for key, part in other.partitions.items():
            mine = self.partitions.setdefault(key, PartitionStats(key))
            if (part.direct is not None and (mine.direct is not None or mine.spill)) or (mine.direct and part.spill):
                raise InvalidJob(f"partition {key.name} was written by a scan task, yet another task read rows of it")
            mine.rows += part.rows
            mine.nbytes += part.nbytes
            mine.check_sum += part.check_sum
            mine.spill.extend(part.spill)
            mine.buckets.update(part.buckets)
            mine.spill_bytes += part.spill_bytes
            mine.direct = mine.direct or part.direct
        self.sample_rows += other.sample_rows
        self.sample_bytes += other.sample_bytes
        self.overlap_existing_rows += other.overlap_existing_rows
        self.dst_undetermined.extend(other.dst_undetermined)
        self.duplicates_in_source += other.duplicates_in_source
        self.add_mapped(other.issues, other.states, other.issue_days)

    def add_mapped(self, issues: Issues, states: Counter, issue_days: Counter) -> None:
        """A mapped batch's (or another result's) tallies: issues per column, states, issue rows per day."""
        self.issues.merge(issues)
        self.issue_days.update(issue_days)
        for state, rows in states.items():
            self.states[state if state in self.states or len(self.states) < MAX_STATES else OTHER_STATES] += rows

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_in_source": self.rows_in_source, "rejected": dict(self.rejected), "examples": self.examples,
            "rows_outside_range": self.rows_outside_range, "rows_outside_retention": self.rows_outside_retention,
            "min_us": self.min_us, "max_us": self.max_us, "days": {str(k): v for k, v in self.days.items()},
            "partitions": [{"spec_id": p.key.spec_id, "transform": p.key.transform, "value": p.key.value,
                            "rows": p.rows, "nbytes": p.nbytes, "check_sum": p.check_sum, "spill": p.spill,
                            "buckets": {str(b): n for b, n in p.buckets.items()}, "spill_bytes": p.spill_bytes,
                            "direct": p.direct}
                           for p in self.partitions.values()],
            "sample_rows": self.sample_rows, "sample_bytes": self.sample_bytes,
            "overlap_existing_rows": self.overlap_existing_rows, "dst_undetermined": self.dst_undetermined,
            "duplicates_in_source": self.duplicates_in_source, "issues": self.issues.to_json(),
            "states": dict(self.states), "issue_days": {str(k): v for k, v in self.issue_days.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanResult:
        result = cls(
            rows_in_source=data["rows_in_source"], rejected=Counter(data["rejected"]), examples=data["examples"],
            rows_outside_range=data["rows_outside_range"], rows_outside_retention=data["rows_outside_retention"],
            min_us=data["min_us"], max_us=data["max_us"], days=Counter({int(k): v for k, v in data["days"].items()}),
            sample_rows=data["sample_rows"], sample_bytes=data["sample_bytes"],
            overlap_existing_rows=data["overlap_existing_rows"], dst_undetermined=data.get("dst_undetermined", []),
            duplicates_in_source=data.get("duplicates_in_source", 0), issues=Issues.from_json(data.get("issues", [])),
            states=Counter(data.get("states", {})),
            issue_days=Counter({int(k): v for k, v in data.get("issue_days", {}).items()}),
        )
        for p in data["partitions"]:
            key = PartitionKey(p["spec_id"], p["transform"], p["value"])
            result.partitions[key] = PartitionStats(key, p["rows"], p["nbytes"], p["check_sum"], list(p["spill"]),
                                                    Counter({int(b): n for b, n in p["buckets"].items()}),
                                                    p.get("spill_bytes", 0), p.get("direct"))
        return result


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class _Spiller:
    """The task's spill file (see `timelake.steps.spill`), opened at the first row spilled, which every
    partition the task spills shares. Batches wait whole until HELD_BYTES are held, then one flush
    writes every partition's rows of them: a batch spread over many partitions (a file per device) is
    only freed once each of them has written its rows. Writing the fullest partition alone kept nearly
    every batch read: over 120 days of files per device, a scan's peak memory was 1.8× that over 30
    days.

    The partitions of ``direct`` (see `plan.plan_direct`) are held whole instead, and handed to
    ``finish`` (with this spiller, whose dictionaries decode them) once the piece after their last one
    is read (`advance`); one that ``finish`` declines is spilled like the rest."""

    def __init__(self, rt: Runtime, job_id: str, task: int, schema: pa.Schema, series_key: tuple[str, ...],
                 direct: dict[str, dict[str, Any]] | None = None,
                 finish: Callable[[_Spiller, PartitionStats, pa.Table], bool] | None = None, join_bytes: int = 0) -> None:
        self.uri = rt.staging_path(job_id, "spill")
        self.objects = rt.objects
        self.task = task
        self.dictionaries = spill.Dictionaries(schema, series_key)
        self.file: spill.SpillFile | None = None
        self.parts: dict[tuple[int, int], PartitionStats] = {}
        self.direct = dict(direct or {})
        self.finish = finish
        self.whole: dict[PartitionKey, tuple[PartitionStats, list[pa.Table], list[np.ndarray | None]]] = {}
        self.whole_rows = 0
        self.join_bytes = join_bytes

    def code(self, rows: pa.Table) -> pa.Table:
        return self.dictionaries.code(rows)

    def write(self, parts: list[PartitionStats | None], codes: np.ndarray, rows: pa.Table,
              buckets: np.ndarray | None, runs: np.ndarray | None = None) -> None:
        """Spill ``rows`` (coded by `code`), row i of ``parts[codes[i]]`` with series bucket ``buckets[i]``,
        or hold the rows of partitions the task writes itself. With ``runs`` (where runs of rows start),
        ``codes`` and ``buckets`` are the runs'."""
        whole = {code: part for code, part in enumerate(parts) if part is not None and part.key.name in self.direct}
        if whole and runs is not None:  # held by partition: a code and bucket a row
            sizes = np.diff(runs, append=rows.num_rows)
            codes, buckets, runs = np.repeat(codes, sizes), np.repeat(buckets, sizes) if buckets is not None else None, None
        if whole and len(whole) == sum(part is not None for part in parts):  # every row's partition: no row to pick out
            self._hold_whole(whole, codes, rows, buckets)
            return
        if whole:
            mine = np.isin(codes, list(whole))
            self._hold_whole(whole, codes[mine], rows if mine.all() else rows.filter(pa.array(mine)),
                             buckets[mine] if buckets is not None else None)
            if mine.all():
                return
            keep = ~mine
            rows, codes, buckets = rows.filter(pa.array(keep)), codes[keep], buckets[keep] if buckets is not None else None
            parts = [None if code in whole else part for code, part in enumerate(parts)]
        self._spill(parts, codes, rows, buckets, runs)

    def _spill(self, parts: list[PartitionStats | None], codes: np.ndarray, rows: pa.Table,
               buckets: np.ndarray | None, runs: np.ndarray | None = None) -> None:
        if self.file is None:
            fs, root = self.objects.filesystem(self.uri)
            fs.create_dir(root, recursive=True)
            self.file = spill.SpillFile(f"{self.uri}/t{self.task:05d}.arrow", self.dictionaries, self.join_bytes,
                                        objects=self.objects)
        keys: list[tuple[int, int] | None] = []
        for part in parts:
            key = None if part is None else (part.key.spec_id, part.key.value)
            if part is not None and key is not None and key not in self.parts:
                self.parts[key] = part
                part.spill.append(self.file.uri)
            keys.append(key)
        self.file.hold(rows, keys, codes, buckets, rows.nbytes, runs)
        if self.file.held_bytes > HELD_BYTES:
            self.file.flush()

    def _hold_whole(self, parts: dict[int, PartitionStats], codes: np.ndarray, rows: pa.Table,
                    buckets: np.ndarray | None) -> None:
        """Holds rows of partitions the task writes itself, row i of ``parts[codes[i]]``, in runs."""
        order, runs = code_runs(codes, repeats=True)  # joined time-ordered files: their runs, not a sort
        if order is not None:
            rows = gather(rows, order)
            buckets = buckets[order] if buckets is not None else None
        for code, lo, hi in runs:
            part = parts[code]
            _, tables, held = self.whole.setdefault(part.key, (part, [], []))
            tables.append(rows.slice(lo, hi - lo))
            held.append(buckets[lo:hi] if buckets is not None else None)
            self.whole_rows += hi - lo
        while self.whole_rows > DIRECT_MAX_ROWS:  # partitions of interleaved pieces: spill the largest
            largest = max(self.whole, key=lambda k: sum(t.num_rows for t in self.whole[k][1]))
            self._settle(largest, spill_it=True)

    def advance(self, piece: int) -> None:
        """The scan reads ``piece`` next: the partitions it holds whose last piece came before are whole."""
        for key in [k for k in self.whole if self.direct[k.name]["last"] < piece]:
            self._settle(key)

    def settle(self) -> None:
        """The task's pieces are all read: every partition it holds is whole."""
        for key in list(self.whole):
            self._settle(key)

    def _settle(self, key: PartitionKey, spill_it: bool = False) -> None:
        part, tables, runs = self.whole.pop(key)
        rows = pa.concat_tables(tables)
        self.whole_rows -= rows.num_rows
        if spill_it or self.finish is None or not self.finish(self, part, rows):
            del self.direct[key.name]
            held = [run for run in runs if run is not None]  # all or none: with a series key or without
            buckets = np.concatenate(held) if held else None
            self._spill([part], np.zeros(rows.num_rows, dtype=np.int64), rows, buckets)

    def close(self) -> None:
        """Writes what is held and closes the file; when that fails (a full disk), the file is discarded."""
        self.whole.clear()
        self.whole_rows = 0
        if self.file is None:
            return
        file, self.file = self.file, None
        for partition, spilled in file.close().items():
            self.parts[partition].spill_bytes += spilled

    def discard(self) -> None:
        """The task failed: its file is closed without writing what it holds."""
        self.whole.clear()
        self.whole_rows = 0
        if self.file is not None:
            self.file.discard()
            self.file = None


@dataclass(frozen=True)
class ScanContext:
    """Everything a scan needs besides its piece; fixed at plan time so every piece cuts rows alike."""

    spec: JobSpec
    contract: Contract
    target: pa.Schema
    cutoffs: list[int]
    retention_cutoff: int | None
    start_us: int | None
    end_us: int | None


def open_job_source(spec: JobSpec, source: Any = None, table: Any = None, planned: dict | None = None) -> Source:
    """``table`` tells a database source its time column; ``planned`` is the source's plan_state()."""
    if source is None and spec.source.startswith("<"):
        raise InvalidJob(f"job {spec.job_id}: the source was in-memory data ({spec.source}) and is gone; start a new job")
    opened = open_spec_source(spec, table, planned) if source is None else None
    if opened is None:
        csv = CsvOptions(delimiter=spec.delimiter, skip_rows=spec.skip_rows, encoding=spec.encoding,
                         null_values=tuple(spec.null_values), skip_after_header=spec.skip_after_header)
        opened = open_source(source if source is not None else spec.source, format=spec.format, csv=csv)
    return wide_source(spec, opened, table) if spec.wide else opened


def wide_source(spec: JobSpec, inner: Source, table: Any) -> Source:
    """A wide export read as long rows: the table's series key from the column names, its value column
    (the contract's check column, else its first numeric column left) from the cells."""
    contract = Contract.from_table(table)
    schema = table.schema().as_arrow()
    made = [*contract.series_key]
    taken = {contract.time_column, *made, *(spec.map.get(i, i) for i in spec.id_columns), spec.states_column}
    numeric = [f.name for f in schema if f.name not in taken and (pa.types.is_floating(f.type) or pa.types.is_integer(f.type))]
    if not numeric:
        raise InvalidJob(f"wide source: table {spec.table} has no numeric column left to hold the values")
    value = contract.check_column if contract.check_column is not None and contract.check_column in numeric else numeric[0]
    mapped = [name for name in spec.map if name in (*made, value)]
    if mapped:
        raise InvalidJob(f"wide source: the series key and the value come from the column names and cells; "
                         f"drop {', '.join(mapped)} from the column map")
    time = spec.map.get(contract.time_column, contract.time_column)
    return WideSource(inner, time, list(spec.id_columns), made, value, spec.key_separator)


def mapper_for(ctx: ScanContext, src: Source, keep_dictionary: tuple[str, ...] = ()) -> Mapper:
    return Mapper(
        ctx.target, src.schema(), time_column=ctx.contract.time_column, series_key=list(ctx.contract.series_key),
        column_map=ctx.spec.map, tz=ctx.spec.tz, time_unit=ctx.spec.time_unit, dst_policy=ctx.spec.dst_policy,
        on_bad_value=ctx.spec.on_bad_value, decimal=ctx.spec.decimal, thousands=ctx.spec.thousands,
        timestamp_format=ctx.spec.timestamp_format, states_column=ctx.spec.states_column, keep_dictionary=keep_dictionary,
        fold_by=[] if ctx.spec.wide else None,
    )


def result_uri(rt: Runtime, job_id: str, task: int) -> str:
    return rt.staging_path(job_id, "scan", f"task-{task:05d}.json")


def direct_name(task: int) -> str:
    return f"scan/direct-{task:05d}.json"


def direct_plan(rt: Runtime, job_id: str, task: int) -> dict[str, dict[str, Any]]:
    """The partitions scan task ``task`` writes itself, by name: spec id, transform, value, last piece."""
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, direct_name(task)))
    try:
        with fs.open_input_stream(path) as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return {}


def read_result(rt: Runtime, job_id: str, task: int) -> ScanResult | None:
    fs, path = rt.objects.filesystem(result_uri(rt, job_id, task))
    try:
        with fs.open_input_stream(path) as handle:
            return ScanResult.from_json(json.loads(handle.read()))
    except FileNotFoundError:
        return None


def scan_task(rt: Runtime, ctx: ScanContext, job_id: str, task: int, pieces: range, src: Source, table: Any,
              main: MainReader | None = None) -> ScanResult:
    """Scan one task (a run of source pieces); idempotent (a finished task returns its stored result).
    ``main``: in merge mode, main's reader that the scan tasks of this process share (`plan.tasks_main`);
    without it a task that writes partitions plans main over them itself."""
    done = read_result(rt, job_id, task)
    if done is not None:
        return done
    names = src.pieces()
    coded = spill.coded_columns(ctx.target, ctx.contract.series_key)  # the spill stores them as codes: read them so
    mapper = mapper_for(ctx, src, coded)
    src.read_dictionaries({mapper.source_of[name] for name in coded})
    result = ScanResult()
    spiller: _Spiller | None = None
    predicts = compares(ctx.spec.mode, ctx.spec.diff)  # a dry run of a job with a diff spills as the run would
    if not ctx.spec.dry_run or predicts:
        direct = direct_plan(rt, job_id, task)
        main = _direct_main(ctx, direct, objects=rt.objects) if main is None else main
        spiller = _Spiller(rt, job_id, task, ctx.target, ctx.contract.series_key, direct,
                           lambda held, part, rows: _write_whole(rt, table, ctx, job_id, result, held, part, rows, main),
                           spill.join_bytes(ctx.contract.target_file_size))
    overlap = _OverlapCounter(ctx.contract) if ctx.spec.dry_run and not predicts else None
    index = {names[p]: p for p in pieces}
    batches = throttle.read(src, [names[p] for p in pieces], throttle.budget(rt.store, ctx.spec, job_id, rt.clock))
    tally = Tally(rt.store, job_id, f"scan/{task}")  # what status shows while the task runs
    origins: set[str] = set()
    mapped_rows = _Coalesced(lambda rows: _scan_batch(result, rows, ctx, spiller, overlap))
    try:
        for batch in batches:
            if spiller and spiller.direct:
                mapped_rows.flush()
                spiller.advance(index[batch.origin])
            mapped = mapper.apply(batch)
            result.rows_in_source += batch.data.num_rows + batch.rejected
            origins.add(batch.origin)
            tally.set(rows=result.rows_in_source, pieces=len(origins) - 1)
            result.rejected.update(mapped.rejected)
            merge_examples(result.examples, mapped.examples)
            result.add_mapped(mapped.issues, mapped.states, mapped.issue_days)
            if batch.rejected:
                result.rejected["bad_line"] += batch.rejected
                merge_examples(result.examples, {"bad_line": " | ".join(batch.examples)})
            if not ctx.spec.dry_run:
                refuse_dst(result, ctx.spec.dst_policy)
            mapped_rows.add(mapped.table)
        mapped_rows.flush()
        result.dst_undetermined = mapper.undetermined()
        if not ctx.spec.dry_run:
            refuse_dst(result, ctx.spec.dst_policy)
        if spiller:
            spiller.settle()
        for part in result.partitions.values():
            part.counted()
    except BaseException:
        if spiller:
            spiller.discard()
        raise
    if spiller:
        spiller.close()
    if overlap is not None and result.min_us is not None and result.max_us is not None:
        result.duplicates_in_source = overlap.duplicates()
        result.overlap_existing_rows = overlap.finish(table, result.min_us, result.max_us + 1)
    fs, path = rt.objects.filesystem(result_uri(rt, job_id, task))
    rt.objects.make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(result.to_json()).encode())
    tally.close(rows=result.rows_in_source, pieces=len(pieces))
    return result


class _Coalesced:
    """Mapped batches joined into batches of about COALESCE_ROWS before the scan cuts them by partition:
    small source files (a file per device) would otherwise pay that per-batch work per file."""

    def __init__(self, scan: Callable[[pa.Table], None]) -> None:
        self.scan = scan
        self.tables: list[pa.Table] = []
        self.rows = 0

    def add(self, rows: pa.Table) -> None:
        self.tables.append(rows)
        self.rows += rows.num_rows
        if self.rows >= COALESCE_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.tables:
            tables, self.tables, self.rows = self.tables, [], 0
            self.scan(tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks())


def _direct_main(ctx: ScanContext, direct: dict[str, dict[str, Any]], *, objects: ObjectIO) -> MainReader | None:
    """In merge mode, main over the partitions the task writes itself, planned once for all of them."""
    if ctx.spec.mode != "merge" or not direct:
        return None
    spans = [PartitionKey(p["spec_id"], p["transform"], p["value"]).range for p in direct.values()]
    return direct_main(ctx, min(lo for lo, _ in spans), max(hi for _, hi in spans), objects=objects)


def direct_main(ctx: ScanContext, start_us: int, end_us: int, *, objects: ObjectIO) -> MainReader:
    """Main over [start, end) for a merge job's partitions that scan tasks write themselves."""
    # with a diff its units count main's rows as they read them (`MainCounter`): every column, not the key alone
    columns = tuple(ctx.target.names) if compares(ctx.spec.mode, ctx.spec.diff) else ctx.contract.dedup_key
    return MainReader(ctx.contract.time_column, start_us, end_us, columns, objects=objects,
                      dictionaries=spill.coded_columns(ctx.target, ctx.contract.series_key))


def _write_whole(rt: Runtime, table: Any, ctx: ScanContext, job_id: str, result: ScanResult, spiller: _Spiller,
                 part: PartitionStats, rows: pa.Table, main: MainReader | None) -> bool:
    """Write a partition the task holds whole as its one unit's file, as the write step would have
    (`write.write_rows`, with its part of a merge job's diff); False, leaving it to the spill, when the
    file would pass the target size (measured by this task's sample) and so the partition needs several
    units. (A replace job with a diff writes no partition here: its units compare with main's rows,
    which are read after the scan.)"""
    started = time.monotonic()
    per_row = result.sample_bytes / result.sample_rows if result.sample_rows else 1.0
    if rows.num_rows * per_row > ctx.contract.target_file_size:
        return False
    lo, hi = part.key.range
    unit = UnitRecord(unit_id=f"{part.key.name}-0of1",
                      info={"spec_id": part.key.spec_id, "value": part.key.value, "start": lo, "end": hi})
    # one chunk: Arrow's take concatenates a chunked table's columns on every call (each row group's, each
    # few sample rows'), so a partition held as many batches is copied together once, here
    rows = spill.decoded(rows, spiller.dictionaries.values).combine_chunks()
    compare = Compare(compared_columns(ctx.target, ctx.contract)) if compares(ctx.spec.mode, ctx.spec.diff) else None
    counter = MainCounter(main, table, compare.columns, ctx.contract) if main is not None and compare is not None else None
    written, facts = write_rows(table, ctx.contract, ctx.spec.mode, job_id, unit, rows, counter or main, compare,
                                objects=rt.objects)
    if facts is not None:
        write_facts(facts_uri(rt, job_id, "units", unit.unit_id), *facts, objects=rt.objects,
                    before=counter.cells() if counter is not None else None)
    if counter is not None:
        written["main_counted_at"] = counter.snapshot_id
    part.direct = {**written, "spill_bytes_read": 0, "seconds": round(time.monotonic() - started, 3)}
    checkpoint("scan.direct")
    return True


def _scan_batch(
    result: ScanResult, rows: pa.Table, ctx: ScanContext, spiller: _Spiller | None, overlap: _OverlapCounter | None
) -> None:
    if rows.num_rows == 0:
        return
    ts = micros(rows, ctx.contract.time_column)
    width = run_width(ctx.contract)
    series = _series_indices(rows, ctx.contract.series_key)
    found = time_runs(ts, width, series, len(ts) // RUN_ROWS)
    result.min_us = _min(result.min_us, found.lowest)
    result.max_us = _max(result.max_us, found.highest)
    if _crosses_bounds(ctx, found.lowest, found.highest):
        keep = np.ones(len(ts), dtype=bool)
        if ctx.start_us is not None:
            keep &= ts >= ctx.start_us
        if ctx.end_us is not None:
            keep &= ts < ctx.end_us
        result.rows_outside_range += int((~keep).sum())
        if ctx.retention_cutoff is not None:
            old = keep & (ts < ctx.retention_cutoff)
            result.rows_outside_retention += int(old.sum())
            keep &= ~old
        if not keep.all():
            rows, ts = rows.filter(pa.array(keep)), ts[keep]
            series = _series_indices(rows, ctx.contract.series_key)
            found = time_runs(ts, width, series, len(ts) // RUN_ROWS)
    if rows.num_rows == 0:
        return
    # a batch of files per series in time order comes in long runs of one series and time bucket, in which
    # the partition and the series bucket are the same: it is cut and counted a run at a time
    runs = found.starts if series is not None or not ctx.contract.series_key else None
    sizes = np.diff(runs, append=len(ts)) if runs is not None else None
    firsts = ts if runs is None else ts[runs]  # each row's time, or each run's first
    days_of = np.floor_divide(firsts, US_PER_DAY)
    days, day_index, day_counts = dense_unique(days_of) if sizes is None else unique_of_runs(days_of, sizes)
    result.days.update(dict(zip(days.tolist(), day_counts.tolist(), strict=True)))
    if result.sample_rows == 0:
        result.sample_rows, result.sample_bytes = _measure(rows.slice(0, SAMPLE_ROWS), ctx.contract)
    if overlap is not None:
        overlap.add(rows)
    codes, keys = partition_codes(firsts, ctx.contract, ctx.cutoffs, days=(days, day_index))
    buckets = None
    if runs is not None and series is not None:
        buckets = _bucket_of_value(rows.column(ctx.contract.series_key[0]), ctx.contract.series_key)[series[runs]]
    elif ctx.contract.series_key:
        buckets = series_bucket(rows, ctx.contract.series_key)
    values = None
    if ctx.contract.check_column:
        column = rows.column(ctx.contract.check_column)
        values = (pc.fill_null(column, 0) if column.null_count else column).to_numpy().astype(np.float64, copy=False)
        values = np.add.reduceat(values, runs) if runs is not None else values
    if spiller:
        rows = spiller.code(rows)
    per_code, counts, sums = _partition_counts(codes, buckets, values, len(keys), sizes)
    bytes_per_row = rows.nbytes / rows.num_rows
    parts: list[PartitionStats | None] = [None] * len(keys)
    present = np.flatnonzero(per_code)
    # plain numbers, once: a batch of a file per device touches every day of the job, a partition each
    sums_of = sums[present].tolist() if sums is not None else [0.0] * len(present)
    for code, count, total in zip(present.tolist(), per_code[present].tolist(), sums_of, strict=True):
        part = result.partitions.get(keys[code])
        if part is None:
            part = result.partitions[keys[code]] = PartitionStats(keys[code])
        parts[code] = part
        part.rows += count
        part.nbytes += round(bytes_per_row * count)
        if counts is not None:
            part.add_buckets(counts[code])
        part.check_sum += total
    if spiller:
        spiller.write(parts, codes, rows, buckets, runs)


def _crosses_bounds(ctx: ScanContext, lowest: int, highest: int) -> bool:
    """Whether rows between ``lowest`` and ``highest`` may lie outside the job's range or retention."""
    return ((ctx.start_us is not None and lowest < ctx.start_us) or (ctx.end_us is not None and highest >= ctx.end_us)
            or (ctx.retention_cutoff is not None and lowest < ctx.retention_cutoff))


def _series_indices(rows: pa.Table, series_key: tuple[str, ...]) -> np.ndarray | None:
    """The dictionary indices of a single series column read as codes (int32, no nulls), which runs of one
    series are found by; None for any other key."""
    if len(series_key) != 1:
        return None
    column = single_array(rows.column(series_key[0]))
    if not pa.types.is_dictionary(column.type) or column.null_count or column.type.index_type != pa.int32():
        return None
    return column.indices.to_numpy()


def _partition_counts(codes: np.ndarray, buckets: np.ndarray | None, values: np.ndarray | None,
                      partitions: int, sizes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Rows per partition code, rows per (code, series bucket) and the sum of ``values`` per code; with
    ``sizes`` the other arrays are of runs of that many rows each (``values`` their sums). A batch of a file
    per series holds long runs of one code and bucket: they are counted and summed per run (a sequential
    sum each), not per row (a scattered add each). A batch in time order holds a partition's rows together
    but changes series every row: its few runs of one code are counted and summed per run, and only its
    buckets per row (numpy's passes over a batch hold the interpreter: looking for runs of code and bucket
    there, then counting every row three times, took 4.4 ms a batch of 262,144 rows, 0.2 s of a
    day-ordered job at 1x; 0.5 ms now)."""
    if sizes is None:
        cuts = run_starts_within(codes, CODE_RUNS_COUNTED_APART)
        if cuts is not None:
            return _counts_by_code_run(codes, buckets, values, partitions, cuts)
        starts = run_starts(codes, buckets)
        if len(starts) <= len(codes) // RUN_ROWS:
            sizes = np.diff(np.append(starts, len(codes)))
            codes, buckets = codes[starts], buckets[starts] if buckets is not None else None
            values = np.add.reduceat(values, starts) if values is not None else None
    per_code = np.bincount(codes, weights=sizes, minlength=partitions).astype(np.int64)
    sums = np.bincount(codes, weights=values, minlength=partitions) if values is not None else None
    counts = None
    if buckets is not None:
        counts = np.bincount(codes * SERIES_BUCKETS + buckets, weights=sizes, minlength=partitions * SERIES_BUCKETS)
        counts = counts.astype(np.int64).reshape(partitions, SERIES_BUCKETS)
    return per_code, counts, sums


CODE_RUNS_COUNTED_APART = 16  # at most this many runs of one code: a batch counted a run at a time (a few days)


def _counts_by_code_run(codes: np.ndarray, buckets: np.ndarray | None, values: np.ndarray | None, partitions: int,
                        cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """`_partition_counts` of rows whose codes come in the few runs starting at ``cuts``: rows and sums per
    run, and the buckets of each run's rows counted on their own."""
    ends = np.append(cuts[1:], len(codes))
    of_run = codes[cuts]
    per_code = np.bincount(of_run, weights=ends - cuts, minlength=partitions).astype(np.int64)
    sums = np.bincount(of_run, weights=np.add.reduceat(values, cuts), minlength=partitions) if values is not None else None
    counts = None
    if buckets is not None:
        counts = np.zeros((partitions, SERIES_BUCKETS), dtype=np.int64)
        for code, lo, hi in zip(of_run.tolist(), cuts.tolist(), ends.tolist(), strict=True):
            counts[code] += np.bincount(buckets[lo:hi], minlength=SERIES_BUCKETS)
    return per_code, counts, sums


def series_bucket(rows: pa.Table, series_key: tuple[str, ...]) -> np.ndarray:
    """Bucket of each row's series: the unit of balancing series across a partition's slices. A single
    dictionary-encoded series column is bucketed per distinct value, then looked up per row."""
    column = rows.column(series_key[0]) if len(series_key) == 1 else None
    if column is not None and pa.types.is_dictionary(column.type):
        return by_index(_bucket_of_value(column, series_key), single_array(column)).to_numpy(zero_copy_only=False)
    return (series_hash(rows, series_key) % np.uint64(SERIES_BUCKETS)).astype(np.int64)


def _bucket_of_value(column: pa.Array | pa.ChunkedArray, series_key: tuple[str, ...]) -> np.ndarray:
    """The bucket of each value of a single series column's dictionary."""
    return series_bucket(pa.table({series_key[0]: single_array(column).dictionary}), series_key)


def _measure(sample: pa.Table, contract: Contract) -> tuple[int, int]:
    """Parquet bytes of a sample sorted (and deduplicated) and encoded as the writers will (`write.encoding`),
    so units are sized in file bytes, not Arrow bytes. Left to build a dictionary of every column, the
    writer hashed a device's 32,768 distinct times and values into dictionaries as large as the values,
    which took twice the time (in a per-device job at 1x, 12-28 against 6-9 ms a task) and made the sample
    a fifth larger than the writers' files would be."""
    order, *_ = sorted_order(sample, contract)
    taken = gather(sample, order)
    buffer = io.BytesIO()
    pq.write_table(taken, buffer, row_group_size=contract.parquet.group_rows, **encoding(taken, contract.parquet))
    return sample.num_rows, buffer.tell()


def dst_failure(result: ScanResult, policy: str) -> str | None:
    """Why a run under ``policy`` fails on what the scan found (None when it does not), naming the flag that
    fixes it; a dry run reports it, a run raises it."""
    if result.dst_undetermined:
        shown = "; ".join(result.dst_undetermined[:3]) + (" ..." if len(result.dst_undetermined) > 3 else "")
        return (f"cannot infer the clock change from the source order ({len(result.dst_undetermined)} series hours: "
                f"{shown}): a single pass through the repeated hour or rows out of time order; "
                "choose a policy with --dst-policy earliest|latest|drop")
    refused = ("dst_nonexistent", "dst_ambiguous") if policy in ("refuse", "infer") else ()
    bad = {r: n for r, n in result.rejected.items() if r in refused and n}
    if bad:
        detail = "; ".join(f"{n} {r} (e.g. {result.examples.get(r, '?')})" for r, n in bad.items())
        return (f"local times that do not exist or are ambiguous in the source time zone: {detail}; "
                "choose a policy with --dst-policy earliest|latest|drop")
    return None


def refuse_dst(result: ScanResult, policy: str) -> None:
    if (message := dst_failure(result, policy)) is not None:
        raise DstRefused(message)


class _OverlapCounter:
    """Dry run only: how many in-scope source keys already exist on main (DuckDB spills, memory stays bounded)."""

    def __init__(self, contract: Contract) -> None:
        import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
        self.keys = list(contract.dedup_key)
        self.tmp = tempfile.TemporaryDirectory(prefix="timelake-dry-run-")
        self.con = duckdb.connect(f"{self.tmp.name}/keys.db")
        self.time_column = contract.time_column
        self.created = False

    def add(self, rows: pa.Table) -> None:
        batch = rows.select(self.keys)  # noqa: F841 (read by DuckDB by name)
        verb = "INSERT INTO src SELECT" if self.created else "CREATE TABLE src AS SELECT"
        self.con.execute(f"{verb} {self._cols()} FROM batch")
        self.created = True

    def duplicates(self) -> int:
        """Rows sharing a key with an earlier row: what the writers will count as duplicates in the source."""
        if not self.created:
            return 0
        cols = self._cols()
        return int(self.con.execute(f"SELECT count(*) - (SELECT count(*) FROM (SELECT DISTINCT {cols} FROM src)) "
                                    "FROM src").fetchall()[0][0])

    def _cols(self) -> str:
        return ", ".join(f'"{k}"' for k in self.keys)

    def finish(self, table: Any, start: int, end: int) -> int:
        try:
            if not self.created or table.current_snapshot() is None:
                return 0
            main = read_range(table, self.time_column, start, end, tuple(self.keys))  # noqa: F841
            cols = self._cols()
            return int(self.con.execute(f"SELECT count(*) FROM src SEMI JOIN main USING ({cols})").fetchall()[0][0])
        finally:
            self.con.close()
            self.tmp.cleanup()
