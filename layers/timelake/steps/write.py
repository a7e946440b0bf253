"""Write one unit: its partition's rows, one series slice, sorted, deduplicated, as ONE Parquet file.

A unit never commits to Iceberg; it writes its file at a deterministic path (a retry overwrites the
same object) and records its counts. The overlap mode is applied here: in merge mode, keys already
on main are dropped and counted.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.typedef import Record

from timelake.model.commit import NAN_COUNTS, file_statistics
from timelake.model.contract import Contract
from timelake.model.diff import (
    KINDS, SAMPLES, MainAtPlan, MainCounter, before_cells, cell_schema, cells_of, chunk_runs, combine, compared_columns, compares,
    decoded_columns, differs, facts_uri, kept_runs, runs, sample, series_labels, weights_of, write_facts,
)
from timelake.model.layout import MainReader, by_index, data_location, gather, single_array, stable_argsort, stream_range
from timelake.model.lineage import planned_view
from timelake.model.parquet_settings import ParquetSettings
from timelake.model.spec import JobSpec
from timelake.model.timeutil import US_PER_DAY
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import UnitRecord
from timelake.steps import failures, spill

try:
    from timelake.steps import _keymatch  # compiled at install (_keymatch.c)
except ImportError:  # no compiler at install: numpy's binary search does the same, slower
    _keymatch = None  # type: ignore[assignment]

ARROW_SCHEMA = b"ARROW:schema"  # where pyarrow keeps the Arrow schema in a Parquet footer (base64 of its IPC form)
COMPACT_ROWS = 1 << 20
MERGE_SPAN = 1 << 22  # keys of a file an audited batch of main is merged with at most (32 MB copied)
DICTIONARY_SAMPLE = 2_048  # rows sampled to tell whether a column is worth a Parquet dictionary
# Values the Parquet writer takes per step (its default is 1,024). For a dictionary column (a unit's series)
# every step finds the dictionary values its indices use, to update the column's statistics: a hash table
# built per 1,024 rows was an eighth of encoding a per-device day file. The bytes written are the same.
WRITE_BATCH_ROWS = 8_192
# A unit that read more than this from the spill hands the read's freed pages back before its sort (see
# `_read_slice`); a smaller one leaves them to Arrow's allocator, whose next unit reuses them: handing
# back and faulting in again every small unit's pages took a per-device job over 120 days 250,000 page
# faults (a GB), each a few microseconds on a virtual machine.
RELEASE_BYTES = 64 << 20


@dataclass(frozen=True)
class Writers:
    """What the writer threads of one process share, read once for all their units. ``main``: merge
    mode's reader of main now, or replace mode's of main at the plan, for the units that compare with
    it themselves, so that main is planned once. ``table``: the job's table as planned, where a unit
    needs nothing newer (not in merge mode, whose units each look at main as it is then); loading and
    parsing it took each unit a millisecond or two with the other writers waiting for the interpreter."""

    main: MainReader | MainAtPlan | None = None
    table: Any | None = None


def write_unit(rt: Runtime, job_id: str, unit_id: str, shared: Writers | None = None) -> dict[str, Any]:
    """Write step. Input: job id and unit id. Output: the unit's counts (also recorded in the store)."""
    try:
        return _write_unit(rt, job_id, unit_id, shared or Writers())
    except Exception as exc:
        failures.note(rt, job_id, unit_id, exc)
        raise


def _write_unit(rt: Runtime, job_id: str, unit_id: str, shared: Writers) -> dict[str, Any]:
    job, unit = rt.store.job_and_unit(job_id, unit_id)
    if unit.status == "done":
        return unit.result
    started = time.monotonic()
    spec = JobSpec.model_validate(job.spec)
    table = shared.table if shared.table is not None else planned_view(rt.load_table(spec.table), job.state)
    contract = Contract.from_table(table)
    main = shared.main
    read = spill.SpillRead()
    target = table.schema().as_arrow()
    rows = _read_slice(unit, target, contract, read, objects=rt.objects)
    compare = None
    wanted = compares(spec.mode, spec.diff) and bool(job.state.get("diff"))  # its main tasks were planned at the cut
    if wanted and spec.mode == "replace" and unit.info.get("main_local"):
        at_plan = main if isinstance(main, MainAtPlan) else MainAtPlan(
            table, contract, job.state, job_id, spill.coded_columns(target, contract.series_key), objects=rt.objects)
        compare = Compare(compared_columns(target, contract), at_plan.batches(unit.info["start"], unit.info["end"]), True)
    elif wanted:
        compare = Compare(compared_columns(target, contract),
                          _main_rows(unit, read, objects=rt.objects) if spec.mode == "replace" else None)
    merging = main if isinstance(main, MainReader) else None
    result, facts = write_rows(table, contract, spec.mode, job_id, unit, rows, merging, compare, predict=spec.dry_run,
                               objects=rt.objects)
    if facts is not None:
        write_facts(facts_uri(rt, job_id, "units", unit_id), *facts, objects=rt.objects)
    result["spill_bytes_read"] = read.bytes_read
    result["seconds"] = round(time.monotonic() - started, 3)
    rt.store.complete_unit(job_id, unit_id, result)
    return result


@dataclass
class Compare:
    """What a unit compares its rows with for the job's diff (`timelake.model.diff`): the compared
    columns and, in replace mode, main's rows of the unit's partition and series buckets as the plan
    found them, a read at a time (None in merge mode, where main's rows stay as they are): read by
    the unit itself when its partition is its own, else from the main tasks' spill."""

    columns: list[str]
    old: Iterable[pa.Table] | None = None
    counts_before: bool = False  # the old rows are the partition's all (a unit of its own): count them too


def _main_rows(unit: UnitRecord, counter: spill.SpillRead, *, objects: ObjectIO) -> Iterable[pa.Table]:
    """Main's rows of the unit's partition and buckets, from the spills of the main tasks whose time span
    meets the partition (`timelake.steps.diff`): the bytes of this unit's buckets only."""
    return spill.read(unit.info.get("main_spill", []), (unit.info["spec_id"], unit.info["value"]), unit.info["buckets"], counter,
                      objects=objects)


Facts = tuple[pa.Table, dict[str, list[dict[str, Any]]]]


def write_rows(table: Any, contract: Contract, mode: str, job_id: str, unit: UnitRecord, rows: pa.Table,
               main: MainReader | MainCounter | None = None, compare: Compare | None = None,
               predict: bool = False, *, objects: ObjectIO) -> tuple[dict[str, Any], Facts | None]:
    """A unit's rows as its file: sorted, the last source row of each key kept, in merge mode the keys
    main holds in the unit's partition dropped; returns what the unit records (counts, file, statistics)
    and, with ``compare``, its part of the job's diff (cells and sample rows). ``predict`` (a dry run)
    writes no file. The write step calls it on rows read from the spill; a scan on a partition it holds whole."""
    order, dup_sum, duplicates, codes = sorted_order(rows, contract)
    starts = runs(codes.columns, len(contract.series_key)) if compare is not None else None
    conflicts, conflict_sum = 0, 0.0
    if mode == "merge" and len(order) and table.current_snapshot() is not None:
        existing = (main.batches(table, unit.info["start"], unit.info["end"]) if main is not None else
                    stream_range(table, contract.time_column, unit.info["start"], unit.info["end"], contract.dedup_key,
                                 objects=objects))
        keyed = rows if codes.packs(contract) else gather(rows.select(list(contract.dedup_key)), order)
        # main's rows a batch at a time, against the unit's sort codes (`met`; else its keys packed in their place)
        mask = existing_mask(keyed, existing, contract, codes, consume=True, ordered=True)
        del keyed
        if mask.any():
            order, conflicts, conflict_sum = _drop_marked(rows, order, mask, contract)
            starts = kept_runs(starts, mask) if starts is not None else None
    # replace mode packs the unit's keys in place of its sort codes, to match main's rows against them
    pairs = _Pairs(rows, order, codes, contract) if compare is not None and compare.old is not None else None
    del codes  # the file is written from the rows and their order alone
    after = _AfterCounts(starts, compare.columns) if compare is not None and starts is not None else None
    result: dict[str, Any] = {
        "rows_in": rows.num_rows, "rows_written": len(order), "rows_duplicate_in_source": duplicates,
        "rows_conflicting_existing": conflicts, "duplicate_sum": dup_sum, "conflict_sum": conflict_sum,
        "path": None, "bytes": 0, "spec_id": unit.info["spec_id"], "value": unit.info["value"],
    }
    if len(order) and not predict:  # the diff's counts come from the row groups the writer takes in order
        result.update(write_file(table, rows, unit_path(table, job_id, unit), contract.parquet, order, objects=objects,
                                 each_group=after.add if after is not None else None))
    elif after is not None:
        after.take(rows, order)
    if compare is None or starts is None or after is None:
        return result, None
    return result, _compare(rows, order, starts, contract, compare, pairs, after.counted)


def _compare(rows: pa.Table, order: np.ndarray, starts: np.ndarray, contract: Contract, compare: Compare,
             pairs: _Pairs | None, counted: dict[str, np.ndarray]) -> Facts:
    """The unit's cells of the job's diff: its rows per day and series (the runs at ``starts`` in ``order``,
    `diff.runs`, ``counted`` by `_AfterCounts`), and in replace mode how they meet main's rows of the
    unit's slice (``pairs``): keys in both, values that changed, rows only one side holds, with a few of
    each side by side. Main's rows come a read at a time and the unit's values a chunk at a time, so the
    comparison adds a flag a row (replace mode) to what the writer holds."""
    columns = compare.columns
    samples: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    firsts_at = rows.select(contract.sort_columns).take(pa.array(order[starts]))
    codes_of, labels = series_labels(firsts_at, contract.series_key)
    label = labels.take(pa.array(codes_of))
    matched: np.ndarray | None = None
    before: list[pa.Table] = []
    if pairs is not None and compare.old is not None:
        matched, before = _meet(rows, order, starts, contract, compare, pairs, counted, label, samples)
    else:
        counted["only_after"] = counted["rows_after"]
    alone = _first_unmatched(matched, len(order), SAMPLES)
    _sample_side(samples, "only_after", rows.take(pa.array(order[alone])), list(contract.dedup_key), columns, contract)
    time_codes = firsts_at.column(contract.time_column).cast(pa.int64()).to_numpy(zero_copy_only=False)
    after = cells_of(cell_schema(columns), time_codes // US_PER_DAY, label, counted)
    return (combine([after, *before], columns) if before else after), samples


class _AfterCounts:
    """Per run (a cell), the rows written and each column's sum and non-null count, added up a chunk of
    rows in written order at a time: the row groups the writer takes anyway, so a value column is
    gathered once for the file and the diff together (taken here only when no file is written)."""

    def __init__(self, starts: np.ndarray, columns: list[str]) -> None:
        self.starts = starts
        self.columns = columns
        self.counted = {"rows_after": np.zeros(len(starts))}
        for column in columns:
            self.counted[f"{column}.count_after"] = np.zeros(len(starts))
            self.counted[f"{column}.sum_after"] = np.zeros(len(starts))

    def add(self, i: int, chunk: pa.Table) -> None:
        """Counts the rows [i, i + len) of the written order, ``chunk`` holding them."""
        if not chunk.num_rows:
            return
        firsts, cells = chunk_runs(self.starts, i, i + chunk.num_rows)
        lengths = np.diff(np.append(firsts, chunk.num_rows))
        self.counted["rows_after"][cells] += lengths
        for column in self.columns:
            values, valid = weights_of(chunk.column(column))
            self.counted[f"{column}.count_after"][cells] += lengths if valid is None else np.add.reduceat(valid, firsts)
            if values is not None:
                self.counted[f"{column}.sum_after"][cells] += np.add.reduceat(values, firsts)

    def take(self, rows: pa.Table, order: np.ndarray) -> None:
        """Counts ``rows`` in ``order``, the compared columns taken a chunk at a time."""
        for i in range(0, len(order), COMPACT_ROWS):
            self.add(i, gather(rows.select(self.columns), order[i:i + COMPACT_ROWS]))


def _meet(rows: pa.Table, order: np.ndarray, starts: np.ndarray, contract: Contract, compare: Compare, pairs: _Pairs,
          counted: dict[str, np.ndarray], label: pa.Array,
          samples: dict[str, list[dict[str, Any]]]) -> tuple[np.ndarray, list[pa.Table]]:
    """Replace mode: main's rows of the unit's slice, a read at a time, against the unit's: per cell the
    keys in both, the rows and each column's values that changed, the rows only after (into
    ``counted``), samples of each kind; which of the unit's rows main holds, and main's rows counted per
    cell when the unit reads its partition's all (``compare.counts_before``)."""
    columns, keys, size = compare.columns, list(contract.dedup_key), len(starts)
    matched = np.zeros(len(order), dtype=bool)
    before: list[pa.Table] = []
    for name in ("in_both", "changed", *(f"{c}.changed" for c in columns)):
        counted[name] = np.zeros(size)
    for old in compare.old or ():
        if compare.counts_before:
            before.append(before_cells(old, columns, contract))
        pos, at = pairs.of(old)
        matched[pos] = True
        cell = np.searchsorted(starts, pos, side="right") - 1
        counted["in_both"] += np.bincount(cell, minlength=size)
        any_changed = np.zeros(len(pos), dtype=bool)
        if len(pos):
            for column in columns:
                changed = differs(old.column(column).take(pa.array(at)), rows.column(column).take(pa.array(order[pos])))
                counted[f"{column}.changed"] += np.bincount(cell[changed], minlength=size)
                any_changed |= changed
        counted["changed"] += np.bincount(cell[any_changed], minlength=size)
        _sample_pairs(samples, rows, order, old, pos[any_changed], at[any_changed],
                      label.take(pa.array(cell[any_changed])), keys, columns, contract)
        if len(samples["only_before"]) < SAMPLES:
            alone = np.ones(old.num_rows, dtype=bool)
            alone[at] = False
            _sample_side(samples, "only_before", old.take(pa.array(np.flatnonzero(alone)[:SAMPLES])), keys, columns, contract)
    counted["only_after"] = counted["rows_after"].copy()
    for i in range(0, len(order), COMPACT_ROWS):
        j = min(len(order), i + COMPACT_ROWS)
        firsts, cells = chunk_runs(starts, i, j)
        counted["only_after"][cells] -= np.add.reduceat(matched[i:j].astype(np.int32), firsts)
    return matched, before


def _first_unmatched(matched: np.ndarray | None, rows: int, count: int) -> np.ndarray:
    """The first ``count`` positions not ``matched`` (all positions when nothing was matched against)."""
    if matched is None:
        return np.arange(min(rows, count))
    found: list[np.ndarray] = []
    for i in range(0, rows, COMPACT_ROWS):
        found.append(np.flatnonzero(~matched[i:i + COMPACT_ROWS])[:count] + i)
        if sum(len(f) for f in found) >= count:
            break
    return np.concatenate(found)[:count] if found else np.zeros(0, dtype=np.int64)


class _Pairs:
    """Matches main's rows with a unit's, key by key: by binary search among the unit's keys packed into
    one int64 each (`KeyPacker`, in place of its sort codes) for the usual key, else by Arrow's join."""

    def __init__(self, rows: pa.Table, order: np.ndarray, codes: KeyCodes, contract: Contract) -> None:
        self.rows, self.order, self.contract = rows, order, contract
        self.packer: KeyPacker | None = None
        self.mine = np.empty(0, dtype=np.int64)
        series = packed_series(contract)
        if series is not None and len(order) and codes.packs(contract) and codes.columns:
            ranks, times = codes.columns[0], codes.columns[1]
            self.packer = KeyPacker.fit(series, contract.time_column, codes.distinct[series], int(times.min()), int(times.max()))
            if self.packer is not None:
                reuse = times.flags.writeable and times.dtype == np.int64
                self.mine = self.packer.pack(ranks, times, out=times if reuse else None)  # ascending: rows sorted, keys unique
                codes.columns.clear()
        self.keyed: pa.Table | None = None

    def of(self, old: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """(positions in ``order``, row numbers of ``old``) of the rows whose keys are equal."""
        if not len(self.order) or not old.num_rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.packer is not None:
            theirs, at = self.packer.pack_rows(old)
            pos = np.minimum(np.searchsorted(self.mine, theirs), len(self.mine) - 1)
            hit = self.mine[pos] == theirs
            return pos[hit].astype(np.int64), np.flatnonzero(hit) if at is None else at[hit].astype(np.int64)
        keys = list(self.contract.dedup_key)
        if self.keyed is None:
            mine = decoded_columns(gather(self.rows.select(keys), self.order))
            self.keyed = mine.append_column("__mine", pa.array(np.arange(len(self.order))))
        theirs = decoded_columns(old.select(keys)).cast(self.keyed.select(keys).schema)
        theirs = theirs.append_column("__theirs", pa.array(np.arange(old.num_rows)))
        joined = self.keyed.join(theirs, keys=keys, join_type="inner")
        return (joined.column("__mine").to_numpy().astype(np.int64), joined.column("__theirs").to_numpy().astype(np.int64))


def _sample_pairs(samples: dict[str, list[dict[str, Any]]], rows: pa.Table, order: np.ndarray, old: pa.Table,
                  pos: np.ndarray, at: np.ndarray, labels: pa.Array, keys: list[str], columns: list[str],
                  contract: Contract) -> None:
    """Keep the first changed rows (in the table's order), before and after side by side; ``labels``: each
    pair's series."""
    room = SAMPLES - len(samples["changed"])
    if room <= 0 or not len(pos):
        return
    first = np.argsort(pos, kind="stable")[:room]
    after = rows.select(keys + columns).take(pa.array(order[pos[first]])).to_pylist()
    before = old.select(columns).take(pa.array(at[first])).to_pylist()
    for i, new, was in zip(first.tolist(), after, before, strict=True):
        key = {k: new[k] for k in keys}
        samples["changed"].append(sample(key, contract.time_column, was, {c: new[c] for c in columns}, labels[i].as_py()))


def _sample_side(samples: dict[str, list[dict[str, Any]]], kind: str, rows: pa.Table, keys: list[str],
                 columns: list[str], contract: Contract) -> None:
    """Keep a few rows that only one side holds."""
    room = SAMPLES - len(samples[kind])
    if room <= 0 or not rows.num_rows:
        return
    picked = rows.slice(0, room)
    codes, labels = series_labels(picked, contract.series_key)
    for i, row in enumerate(picked.select(keys + columns).to_pylist()):
        values = {c: row[c] for c in columns}
        key = {k: row[k] for k in keys}
        label = labels[int(codes[i])].as_py()
        samples[kind].append(sample(key, contract.time_column, values if kind == "only_before" else None,
                                    values if kind == "only_after" else None, label))


def _read_slice(unit: UnitRecord, target: pa.Schema, contract: Contract, counter: spill.SpillRead, *,
                objects: ObjectIO) -> pa.Table:
    """The unit's rows, from the byte ranges of its series buckets in its partition's spill files: no
    byte is read for another unit.

    Reads come back as tables over the buffers of whole range reads; every ``COMPACT_ROWS`` rows they
    are copied into compact arrays so those buffers are freed as the read goes on. Text series columns
    come dictionary-encoded from the spill and stay so (a few thousand series, not millions of
    strings), so a unit's rows take little more memory than their numbers; `write_parquet` casts each
    row group back to the table's types."""
    series = set(spill.coded_columns(target, contract.series_key))
    read_before = counter.bytes_read
    pending: list[tuple[pa.Table, dict[str, pa.Array]]] = []
    pending_rows = 0
    compact: dict[str, list[pa.Array]] = {name: [] for name in target.names}

    def flush() -> None:
        for name in target.names:
            if name not in series:
                compact[name].append(pa.concat_arrays([chunk for rows, _ in pending for chunk in rows.column(name).chunks]))
                continue
            # a spill file's codes together, then wrapped in its dictionary once: a unit reads a file in
            # several reads one after another (one per flush of the scan), and wrapping each read's cost as
            # much as copying it. Consecutive reads only: files with equal dictionaries share one parsed
            # object, and joining their codes out of turn would put rows out of line with the other columns.
            runs: list[tuple[list[pa.Array], dict[str, pa.Array]]] = []
            for rows, dictionaries in pending:
                if not runs or runs[-1][1] is not dictionaries:
                    runs.append(([], dictionaries))
                runs[-1][0].extend(rows.column(name).chunks)
            parts = []
            for chunks, dictionaries in runs:
                codes, values = pa.concat_arrays(chunks), dictionaries.get(name)
                parts.append(pa.DictionaryArray.from_arrays(codes, values) if values is not None else
                             codes if pa.types.is_dictionary(codes.type) else pc.dictionary_encode(codes))
            compact[name].append(pa.concat_arrays(parts))
        pending.clear()

    for rows, dictionaries in spill.read_coded(unit.info["spill"], (unit.info["spec_id"], unit.info["value"]),
                                               unit.info["buckets"], counter, objects=objects):
        pending.append((rows, dictionaries))
        pending_rows += rows.num_rows
        if pending_rows >= COMPACT_ROWS:
            flush()
            pending_rows = 0
    if pending:
        flush()
    if not compact[target.names[0]]:
        return target.empty_table()
    columns = []
    for name in target.names:
        chunks = pa.chunked_array(compact.pop(name))
        columns.append(single_array(chunks.unify_dictionaries() if name in series else chunks))  # one flush: no copy
        del chunks
    fields = [f.with_type(c.type) for f, c in zip(target, columns, strict=True)]  # keeps the Iceberg field ids
    # Arrow's allocator keeps the pages of the read's buffers for its own reuse; the sort that follows
    # allocates through numpy, which cannot use them, so a large unit's go back to the system now (~0.4 GB
    # a 33M-row unit).
    if counter.bytes_read - read_before > RELEASE_BYTES:
        pa.default_memory_pool().release_unused()
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=target.metadata))


def sort_keys(contract: Contract) -> list[tuple[str, str]]:
    """The table's sort order: series key, time, then any other dedup columns."""
    return [(c, "ascending") for c in contract.sort_columns]


def sorted_order(rows: pa.Table, contract: Contract) -> tuple[np.ndarray, float, int, KeyCodes]:
    """The row numbers of ``rows`` in the table's sort order, keeping the LAST source row of each dedup key
    (later rows in an export are corrections); the duplicates' count and check sum; the kept rows' sort
    codes, which merge mode reuses to find the keys already on main.

    The rows themselves are not reordered: the writer takes them in order one row group at a time, so a
    unit holds its rows once, not twice."""
    keys = sort_key_codes(rows, contract)
    if rows.num_rows == 0:
        return np.empty(0, dtype=np.int64), 0.0, 0, keys
    columns = keys.columns
    order, repeats = _stable_order(columns)
    duplicates = int(repeats.sum())
    if not duplicates:
        return order, 0.0, 0, keys
    return order[~repeats], _sum_at(rows, order[repeats], contract), duplicates, KeyCodes([c[~repeats] for c in columns], keys.distinct)


def _stable_order(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The stable order of rows by ``columns`` (the first is the primary key), and which rows in that
    order repeat the key of the next; replaces each column by its copy in that order, one at a time, so a
    unit holds its codes about once.

    Rows mostly arrive in time order within each series (exports are written so, and the spill keeps
    a series' rows in source order): a stable sort by the first column alone then orders them fully,
    and a series rank of fewer than 65,536 values sorts as uint16, which numpy radix-sorts in linear
    time. One pass (`in_order`) checks that the other columns ascend within each run of the first; if
    one does not, a lexicographic sort of the columns so taken decides. Either way rows with equal keys
    stay in source order."""
    first = columns[0]
    order = stable_argsort(first)
    del first  # the list holds it until its sorted copy replaces it
    for i, codes in enumerate(columns):
        columns[i] = codes[order]
        del codes
    unsorted_at, repeats = in_order(columns)
    if unsorted_at is None:
        return order, repeats
    again = np.lexsort(columns[::-1])
    for j in range(len(columns)):
        columns[j] = columns[j][again]
    return order[again], in_order(columns)[1]


def in_order(columns: list[np.ndarray]) -> tuple[int | None, np.ndarray]:
    """For rows' key columns (the first the primary): the first row whose key comes before the one above
    it (None: they ascend), and which rows repeat the key of the next row. The usual key (series codes,
    times) takes one compiled pass (`_keymatch.ordered`)."""
    n = len(columns[0]) if columns else 0
    if _keymatch is not None and len(columns) == 2 and columns[0].dtype in (np.int32, np.int64) and columns[1].dtype == np.int64:
        repeats = np.empty(n, dtype=bool)
        unsorted_at, _ = _keymatch.ordered(np.ascontiguousarray(columns[0]), np.ascontiguousarray(columns[1]), repeats)
        return (unsorted_at if unsorted_at >= 0 else None), repeats
    less = np.zeros(max(n - 1, 0), dtype=bool)
    equal = np.ones(max(n - 1, 0), dtype=bool)
    for c in columns:
        a, b = c[:-1], c[1:]
        less |= equal & (a < b)
        equal &= a == b
    bad = np.flatnonzero(~(less | equal))
    return (int(bad[0]) + 1 if len(bad) else None), np.append(equal, False)[:n]


def _sort_and_dedup(rows: pa.Table, contract: Contract) -> tuple[pa.Table, float, int, KeyCodes]:
    """`sorted_order` applied: the kept rows themselves, in order."""
    order, dup_sum, duplicates, codes = sorted_order(rows, contract)
    return gather(rows, order), dup_sum, duplicates, codes


@dataclass(frozen=True)
class KeyCodes:
    """Rows' sort-order columns as integer arrays that order like the values (see ``sort_key_codes``).

    A string column is each row's rank among ``distinct[name]``, its sorted distinct values.
    """

    columns: list[np.ndarray]
    distinct: dict[str, pa.Array]

    def packs(self, contract: Contract) -> bool:
        """Whether `existing_mask` answers from these codes alone, without the rows."""
        return packed_series(contract) in self.distinct


def packed_series(contract: Contract) -> str | None:
    """The series column when the dedup key is the usual (series, time), which `KeyPacker` packs."""
    series = contract.series_key[0] if len(contract.series_key) == 1 else None
    return series if list(contract.dedup_key) == [series, contract.time_column] else None


def sort_key_codes(rows: pa.Table, contract: Contract) -> KeyCodes:
    """The sort-order columns as integer arrays that order like the values.

    Strings become their rank among the distinct values (a few hundred devices, not millions of rows),
    so the sort compares integers: several times faster than sorting strings row by row.
    """
    codes, distinct = [], {}
    for name, _ in sort_keys(contract):
        column = rows.column(name)
        if pa.types.is_dictionary(column.type):
            dictionary = single_array(column)
            by_value = pc.sort_indices(dictionary.dictionary).to_numpy()
            distinct[name] = dictionary.dictionary.take(pa.array(by_value))
            rank = np.empty(len(by_value), dtype=np.int32)
            rank[by_value] = np.arange(len(by_value), dtype=np.int32)
            codes.append(by_index(rank, dictionary).to_numpy(zero_copy_only=False))
            continue
        if spill.is_text(column.type):
            distinct[name] = pc.unique(column).sort()
            column = pc.index_in(column, value_set=distinct[name])
        elif pa.types.is_timestamp(column.type) and column.null_count == 0:
            column = single_array(column).view(pa.int64())  # the same buffer: a unit's times are not held twice
        elif pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
            column = pc.cast(column, pa.int64())
        codes.append(_numpy(column))
    return KeyCodes(codes, distinct)


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return single_array(column).to_numpy(zero_copy_only=False)


def drop_existing(rows: pa.Table, existing: pa.Table, contract: Contract, codes: KeyCodes | None = None) -> tuple[pa.Table, int, float]:
    """Merge mode: existing rows win. Returns the rows left, how many were dropped and their check sum."""
    if rows.num_rows == 0 or existing.num_rows == 0:
        return rows, 0, 0.0
    mask = existing_mask(rows, existing, contract, codes)
    if not mask.any():
        return rows, 0, 0.0
    conflict_sum = _sum(rows.filter(pa.array(mask)), contract)
    return rows.filter(pa.array(~mask)), int(mask.sum()), conflict_sum


def existing_mask(rows: pa.Table, existing: pa.Table | Iterable[pa.RecordBatch], contract: Contract,
                  codes: KeyCodes | None = None, consume: bool = False, ordered: bool = False) -> np.ndarray:
    """Which of ``rows`` have a key in ``existing`` (a table, or batches read one at a time); ``codes``
    are the rows' ``sort_key_codes`` if known, ``ordered`` if they are in key order (a writer's sorted
    unit), which `met` then answers from them alone.

    For the usual key (one series column + time) the rows' keys become one int64 each (`KeyPacker`) and
    ``existing`` is matched a batch at a time by binary search among them, so memory holds the rows' keys
    (8 bytes a row) and one batch of ``existing``, however much of it there is. Other keys take Arrow's
    join over all of ``existing``. With ``consume``, ``codes`` are used up: the keys are packed over their
    time column and their columns dropped, so a writer holding a whole unit holds its keys once, not
    twice (the codes are 12 bytes a row, the packed keys 8).
    """
    batches = existing.combine_chunks().to_batches() if isinstance(existing, pa.Table) else existing  # one batch: it is all here
    keys = list(contract.dedup_key)
    series = packed_series(contract)
    if rows.num_rows and series is not None:
        codes = codes if codes is not None and series in codes.distinct else None
        if codes is not None and ordered and meets(codes, series):
            mask = met(codes, series, contract.time_column, batches)
            if consume:
                codes.columns.clear()
            return mask
        if codes is None:
            distinct = pc.unique(rows.column(series)).sort()
            ranks = _numpy(pc.fill_null(pc.index_in(rows.column(series), value_set=distinct), len(distinct)))
            times = _numpy(pc.cast(rows.column(contract.time_column), pa.int64()))
        else:
            distinct, ranks, times = codes.distinct[series], codes.columns[0], codes.columns[1]
        packer = KeyPacker.fit(series, contract.time_column, distinct, int(times.min()), int(times.max()))
        if packer is not None:
            reuse = consume and codes is not None and times.flags.writeable and times.dtype == np.int64
            packed = packer.pack(ranks, times, out=times if reuse else None)
            if consume and codes is not None:
                codes.columns.clear()
            del ranks, times
            return packer.mark(packed, batches)
    mask = np.zeros(rows.num_rows, dtype=bool)
    theirs = [batch.select(keys) for batch in batches if batch.num_rows]
    if not rows.num_rows or not theirs:
        return mask
    left = rows.select(keys).append_column("__row", pa.array(np.arange(rows.num_rows)))
    hits = left.join(pa.Table.from_batches(theirs).cast(left.select(keys).schema), keys=keys, join_type="left semi")
    mask[hits.column("__row").to_numpy()] = True
    return mask


@dataclass(frozen=True)
class KeyPacker:
    """Keys of the usual shape (one series column + time) as one int64 each: the series' rank among
    ``distinct`` (sorted values) in the high bits, microseconds since ``base`` in the low ``time_bits``.
    Packed keys order like (series, time), so rows in the table's sort order pack to an ascending array.

    Checking keys against them holds those 8 bytes a row, whatever the size of the other side, which is
    packed a batch at a time; its keys whose series is not in ``distinct`` or whose time is outside
    [base, base + 2^time_bits) cannot match and are left out."""

    series: str
    time_column: str
    distinct: pa.Array
    base: int
    time_bits: int

    CHUNK = 1 << 20  # rows packed at a time: the temporaries stay small beside the packed array

    @classmethod
    def fit(cls, series: str, time_column: str, distinct: pa.Array, first_us: int, last_us: int) -> KeyPacker | None:
        """A packer for series ``distinct`` and times in [first, last]; None when they need over 63 bits."""
        if not cls.room(first_us, last_us, len(distinct)):
            return None
        return cls(series, time_column, distinct, first_us, max(last_us - first_us, 1).bit_length())

    @staticmethod
    def room(first_us: int, last_us: int, series_count: int) -> bool:
        """Whether up to ``series_count`` series and times in [first, last] pack into 63 bits: a caller that
        knows only a bound on the series yet can then pack once it has seen them."""
        return max(last_us - first_us, 1).bit_length() + series_count.bit_length() + 1 <= 63

    def pack(self, ranks: np.ndarray, times: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Packed keys of series ranks and times (µs) that lie inside the packer's range, into ``out`` if
        given (an int64 array of their length, which may be ``times`` itself)."""
        out = np.empty(len(ranks), dtype=np.int64) if out is None else out
        if _keymatch is not None and ranks.dtype in (np.int32, np.int64) and times.dtype == np.int64:
            _keymatch.pack(np.ascontiguousarray(ranks), np.ascontiguousarray(times), self.base, self.time_bits, out)
            return out
        for i in range(0, len(out), self.CHUNK):
            low = times[i:i + self.CHUNK] - self.base  # a copy: ``out`` may be ``times``
            part = out[i:i + self.CHUNK]
            np.left_shift(ranks[i:i + self.CHUNK], self.time_bits, out=part, dtype=np.int64)
            part |= low
        return out

    def pack_rows(self, rows: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, np.ndarray | None]:
        """The packed keys of the ``rows`` that can match, and which rows those are (None: all of them,
        the usual case, which then costs no gather)."""
        return self.pack_keys(rows.column(self.series), _numpy(pc.cast(rows.column(self.time_column), pa.int64())))

    def pack_keys(self, series: pa.Array | pa.ChunkedArray, times: np.ndarray,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """`pack_rows` of a series column and its rows' times (µs); the keys into ``out`` when all can match
        (an int64 array of their length, which may be ``times`` itself)."""
        if _keymatch is not None and times.dtype == np.int64:
            codes, lookup = series_codes_in(series, self.distinct)
            packed = np.empty(len(times), dtype=np.int64) if out is None else out
            if not _keymatch.pack(codes, np.ascontiguousarray(times), self.base, self.time_bits, packed, lookup):
                return packed, None
            at = np.flatnonzero(packed >= 0)  # a key that can match is never negative
            return packed[at], at
        ranks = self._ranks(series)
        low = times - self.base  # as unsigned, a time before ``base`` is past the top as well
        inside = (low.view(np.uint64) < np.uint64(1 << self.time_bits)) & (ranks >= 0)
        if inside.all():  # ``ranks`` is this call's own array: packed in place
            np.left_shift(ranks, self.time_bits, out=ranks)
            ranks |= low
            return ranks, None
        at = np.flatnonzero(inside)
        return self.pack(ranks[at], low[at] + self.base), at

    def _ranks(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Each row's series rank among ``distinct`` as int64, -1 where it has none (`series_codes_in` looked up)."""
        codes, lookup = series_codes_in(column, self.distinct)
        return codes if lookup is None else np.append(lookup, -1)[codes]  # a null's code, -1, takes the -1 appended

    def unpack(self, packed: np.ndarray) -> tuple[pa.Array, np.ndarray]:
        """Series values and times (µs) of packed keys."""
        return self.distinct.take(pa.array(packed >> self.time_bits)), (packed & ((1 << self.time_bits) - 1)) + self.base

    def mark(self, mine: np.ndarray, batches: Iterable[pa.RecordBatch], rare: bool = False) -> np.ndarray:
        """Which of the packed keys ``mine`` (any order, repeats allowed) occur in ``batches``.

        Each batch's keys are sorted (main's files often are already) and walked beside ``mine``'s sorted
        keys in one pass (`_keymatch`). Without the compiled walk each of them is searched for among
        ``mine``'s, 3× slower; ``rare``: few are expected to match (validation's audit of merge mode), so
        each batch is first merged with the keys its range spans (`_seen_twice`) and only the values
        that meet are searched for."""
        mask = np.zeros(len(mine), dtype=bool)
        if not len(mine):
            return mask
        order = None if len(mine) < 2 or bool(np.all(mine[1:] > mine[:-1])) else np.argsort(mine, kind="stable")
        ordered = mine if order is None else mine[order]
        found = mask if order is None else np.zeros(len(mine), dtype=bool)  # by place in ``ordered``
        for batch in batches:
            theirs = self.pack_rows(batch)[0]
            if len(theirs) > 1 and not bool(np.all(theirs[1:] >= theirs[:-1])):
                theirs = self._ascending(theirs)  # the walk needs it; the search, sorted, walks ``ordered`` once: 6× faster
            if _keymatch is not None:
                _keymatch.mark(ordered, theirs, found)
                continue
            if rare and len(theirs):
                theirs = _seen_twice(ordered, theirs)
            at = np.minimum(np.searchsorted(ordered, theirs), len(ordered) - 1)
            at = np.compress(ordered[at] == theirs, at)
            if order is not None:  # repeated keys: every row of an equal run matches
                ends = np.searchsorted(ordered, ordered[at], side="right")
                runs = ends - at > 1
                at = np.concatenate([at[~runs], *(np.arange(a, b) for a, b in zip(at[runs], ends[runs], strict=True))]).astype(np.int64)
            found[at] = True
        if order is not None:
            mask[order] = found
        return mask

    def _ascending(self, keys: np.ndarray) -> np.ndarray:
        """Packed keys sorted. Main's rows in time order (as live writers leave them) only need their series
        put in order, which counting does in two passes (`_keymatch.by_series`), under half the time of a sort."""
        if _keymatch is not None:
            ordered = np.empty_like(keys)
            if _keymatch.by_series(keys, self.time_bits, ordered):
                return ordered
        return np.sort(keys)


def series_codes_in(column: pa.Array | pa.ChunkedArray, distinct: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """Each row's series as a code and, for a dictionary column, the rank among ``distinct`` (sorted
    values) of each code's value (None: the codes are the ranks). A dictionary column's codes are its
    indices (-1 for a null), looked up per distinct value, not per row; any other column's are its rows'
    ranks, -1 where ``distinct`` lacks the series or there is none. The compiled passes (`_keymatch.pack`,
    `_keymatch.meet`) look the codes up themselves; `KeyPacker._ranks` does for numpy."""
    if not pa.types.is_dictionary(column.type):
        found = pc.index_in(column, value_set=distinct.cast(column.type))
        return _numpy(pc.fill_null(found, -1)).astype(np.int64), None
    single = single_array(column.unify_dictionaries() if isinstance(column, pa.ChunkedArray) else column)
    found = pc.index_in(single.dictionary, value_set=distinct.cast(single.type.value_type))
    nulls = single.indices.null_count
    indices = _numpy(pc.fill_null(single.indices, 0) if nulls else single.indices)
    if nulls or indices.dtype not in (np.int32, np.int64):
        indices = indices.astype(np.int64)
    if nulls:
        indices[~_numpy(single.indices.is_valid())] = -1
    return np.ascontiguousarray(indices), _numpy(pc.fill_null(found, -1)).astype(np.int64)


def meets(codes: KeyCodes, series: str) -> bool:
    """Whether `met` answers for keys whose sort codes are ``codes``: the usual key (series ranks among
    distinct values without a null, times in µs), with the compiled pass."""
    distinct = codes.distinct.get(series)
    return _keymatch is not None and distinct is not None and not distinct.null_count and len(codes.columns) == 2 \
        and codes.columns[0].dtype in (np.int32, np.int64) and codes.columns[1].dtype == np.int64


def met(codes: KeyCodes, series: str, time_column: str, batches: Iterable[pa.RecordBatch]) -> np.ndarray:
    """Which of the keys whose sort codes are ``codes`` (as `meets` wants them, in key order, which the
    caller has checked: a writer's sorted unit, a staged file its check found in order) occur in
    ``batches`` (main's rows, in any order), read one at a time.

    The keys are not packed into one int64 each: main's rows are put in series order and each series'
    times walked beside that series' keys (`_keymatch.meet`), which spares packing and sorting both sides
    (a staged file's keys packed were 1.2 ms of its audit, main's packed and sorted 1.6 ms)."""
    distinct = codes.distinct[series]
    ranks, times = (np.ascontiguousarray(c) for c in codes.columns)
    found = np.zeros(len(times), dtype=bool)
    for batch in batches:
        theirs, lookup = series_codes_in(batch.column(series), distinct)
        at = np.ascontiguousarray(_numpy(pc.cast(batch.column(time_column), pa.int64())), dtype=np.int64)
        _keymatch.meet(ranks, times, len(distinct), theirs, at, found, lookup)
    return found


def _seen_twice(ordered: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """The values of sorted ``theirs`` that may be in sorted ``ordered``: those that meet an equal value in a
    stable sort of ``theirs`` and the part of ``ordered`` it spans (the caller's search then keeps those in
    ``ordered``). Timsort merges the two sorted runs in one linear pass, 2-3x faster than a binary search of
    every value when few are common; a span of over ``MERGE_SPAN`` keys is not copied and all of ``theirs``
    is searched for instead."""
    lo, hi = np.searchsorted(ordered, theirs[0]), np.searchsorted(ordered, theirs[-1], side="right")
    if hi - lo > MERGE_SPAN:
        return theirs
    merged = np.concatenate([ordered[lo:hi], theirs])
    merged.sort(kind="stable")
    met = np.unique(merged[1:][merged[1:] == merged[:-1]])
    at = np.minimum(np.searchsorted(theirs, met), len(theirs) - 1)
    return met[theirs[at] == met]  # not a value that repeats in ``ordered`` alone


def _sum(rows: pa.Table, contract: Contract) -> float:
    if not contract.check_column or rows.num_rows == 0:
        return 0.0
    return float(pc.sum(rows.column(contract.check_column)).as_py() or 0)


def _sum_at(rows: pa.Table, at: np.ndarray, contract: Contract) -> float:
    """The check column's sum over the rows numbered ``at``, taken a chunk at a time (a copy of the
    column is not held)."""
    if not contract.check_column or not len(at):
        return 0.0
    column = rows.column(contract.check_column)
    return sum(float(pc.sum(column.take(pa.array(at[i:i + COMPACT_ROWS]))).as_py() or 0)
               for i in range(0, len(at), COMPACT_ROWS))


def _numeric(rows: pa.Table, contract: Contract) -> np.ndarray | None:
    """The check column as numpy sees it without a copy (float64 or int64, one chunk, no nulls), else None."""
    if not contract.check_column:
        return None
    column = rows.column(contract.check_column)
    if column.num_chunks != 1 or column.null_count or column.type not in (pa.float64(), pa.int64()):
        return None
    return column.chunk(0).to_numpy()


def _drop_marked(rows: pa.Table, order: np.ndarray, mask: np.ndarray, contract: Contract) -> tuple[np.ndarray, int, float]:
    """``order`` without its entries that ``mask`` marks, how many those are and their check sum. The kept
    entries are moved to the front of ``order`` a chunk at a time, so neither part is copied whole. Taken
    with ``np.compress``: indexing with a mask that marks rows here and there (main's 30 % of a day) took
    four times as long. The compiled `_keymatch.drop` does it in one pass and sums the check column
    through once, not a row here and there."""
    if _keymatch is not None and order.dtype == np.int64 and order.flags.c_contiguous and order.flags.writeable:
        values = _numeric(rows, contract)
        if values is not None or not contract.check_column:
            kept, dropped_sum = _keymatch.drop(order, mask, values, rows.num_rows)
            return order[:kept], len(order) - kept, dropped_sum
    kept, dropped_sum = 0, 0.0
    for i in range(0, len(order), COMPACT_ROWS):
        part, marked = order[i:i + COMPACT_ROWS], mask[i:i + COMPACT_ROWS]
        dropped_sum += _sum_at(rows, np.compress(marked, part), contract)
        keep = np.compress(~marked, part)  # a copy, so writing it over the front of ``order`` (kept <= i) is safe
        order[kept:kept + len(keep)] = keep
        kept += len(keep)
    return order[:kept], len(order) - kept, dropped_sum


def unit_path(table: Any, job_id: str, unit: UnitRecord, suffix: str = "") -> str:
    """Where a unit's file goes: where Iceberg Java's writers put the table's data files (`layout.data_location`),
    in the unit's partition. Named after the job and the unit, so a unit written again lands on the same path."""
    spec = table.specs()[unit.info["spec_id"]]
    partition = spec.partition_to_path(Record(unit.info["value"]), table.schema())
    return data_location(table, partition, f"{job_id}-{unit.unit_id}{suffix}.parquet")


def write_file(table: Any, rows: pa.Table, path: str, settings: ParquetSettings, order: np.ndarray | None = None, *,
               objects: ObjectIO, each_group: Callable[[int, pa.Table], None] | None = None) -> dict[str, Any]:
    """`write_parquet`, and what a unit records of the file: its path, size and the Iceberg statistics
    of its columns, taken from the writer's own footer metadata (stage builds the DataFile from them).
    ``each_group`` sees every row group as it is written, with its first row's place in the file."""
    size, metadata = _write(rows, path, settings, order, objects=objects, each_group=each_group)
    return {"path": path, "bytes": size, "file_statistics": file_statistics(table, metadata)}


def write_parquet(rows: pa.Table, path: str, settings: ParquetSettings, order: np.ndarray | None = None, *,
                  objects: ObjectIO) -> int:
    """Write one file with Iceberg field ids (from the table's Arrow schema); returns its size in bytes.
    With ``order``, the rows numbered so are written in that order, taken one row group at a time.

    Parquet statistics do not count NaNs, which Iceberg's ``nan_value_counts`` wants for float
    columns (engines prune ``x = 'NaN'`` and ``isnan`` with them): they are counted here and kept in
    the footer, where `timelake.model.commit` reads them with the other statistics."""
    return _write(rows, path, settings, order, objects=objects)[0]


def encoding(rows: pa.Table, settings: ParquetSettings) -> dict[str, Any]:
    """How the writers encode ``rows`` in Parquet: the table's settings (`ParquetSettings`), which columns get
    a dictionary, and how many values a step. A scan's sample of its source is encoded alike
    (`timelake.steps.scan`), so units are sized in the bytes of the files they will be."""
    return {**settings.writer_options(rows),
            "use_dictionary": dictionary_columns(rows, settings.dictionary_bytes), "write_batch_size": WRITE_BATCH_ROWS}


def dictionary_columns(rows: pa.Table, dictionary_bytes: int) -> bool | list[str]:
    """The columns worth a Parquet dictionary. The writer otherwise builds one for every column and, for a
    column of raw measurements (nearly every value distinct), hashes each value only to give up when the
    dictionary outgrows its page (``dictionary_bytes``, the table's `write.parquet.dict-size-bytes`: 2 MB,
    262,144 doubles), leaving a larger file; for such a column that was half the time of writing it. A column
    is written plain when an evenly spread sample of its rows is nearly all distinct: of ``s`` rows sampled
    from ``d`` distinct values about ``s / 2d`` repeat, so with ``d`` the doubles a dictionary page holds,
    fewer repeats mean more values than it holds (at 2 MB, over 99.6 % of the sample distinct). Columns that
    are dictionaries already (the series) and those with repeats (a time grid, readings of fixed precision,
    states) keep theirs."""
    if rows.num_rows == 0 or any(pa.types.is_nested(f.type) for f in rows.schema):
        return True  # a nested column is named by its leaves' paths: left to the writer's default
    picked = pa.array(np.linspace(0, rows.num_rows - 1, min(rows.num_rows, DICTIONARY_SAMPLE), dtype=np.int64))
    distinct_at_most = len(picked) * (1 - len(picked) / (2 * max(dictionary_bytes / 8, 1)))
    return [f.name for f in rows.schema if pa.types.is_dictionary(f.type)
            or pc.count_distinct(rows.column(f.name).take(picked)).as_py() <= distinct_at_most]


def _write(rows: pa.Table, path: str, settings: ParquetSettings, order: np.ndarray | None, *,
           objects: ObjectIO, each_group: Callable[[int, pa.Table], None] | None = None) -> tuple[int, pq.FileMetaData]:
    """Dictionary-encoded columns (a unit's series) are written as they are, which spares the Parquet
    writer hashing every row's string to build its dictionary again. The Arrow schema kept in the footer
    is the plain one (value types, as writing the decoded columns would keep), so pyarrow readers get
    the table's types, not dictionaries. Row groups keep within the table's row and byte limits, the
    bytes a row took in the groups written so far sizing the next."""
    fs, local = objects.filesystem(path)
    objects.make_parent(fs, local)
    count = rows.num_rows if order is None else len(order)
    nans = {}
    for f in rows.schema:
        if pa.types.is_floating(f.type):
            is_nan = pc.is_nan(rows.column(f.name))
            counted = pc.sum(is_nan).as_py() or 0  # counted by Arrow over its bits: no array of a byte a row
            whole = order is None or len(order) == rows.num_rows  # ``order`` never repeats a row
            nans[f.name] = counted if whole or not counted else \
                int(pc.fill_null(is_nan, False).to_numpy(zero_copy_only=False)[order].sum())  # a merge's kept rows: a gather
    metadata = {**(rows.schema.metadata or {}), NAN_COUNTS: json.dumps(nans).encode()}
    plain = pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in rows.schema],
                      metadata=metadata)
    with fs.open_output_stream(local) as out:
        with pq.ParquetWriter(out, rows.schema, store_schema=False, **encoding(rows, settings)) as writer:
            writer.add_key_value_metadata({**metadata, ARROW_SCHEMA: base64.b64encode(plain.serialize().to_pybytes())})
            start, size, begun = 0, settings.first_group_rows(rows), out.tell()
            while start < count:
                group = rows.slice(start, size) if order is None else gather(rows, order[start:start + size])
                writer.write_table(group, row_group_size=size)
                if each_group is not None:
                    each_group(start, group)
                start += group.num_rows
                size = settings.next_group_rows(start, out.tell() - begun)
        return out.tell(), writer.writer.metadata
