"""What a replace or merge job changes in its range, per UTC day and series: the rows only before, only
after and in both, the rows among those in both whose values changed, and per value column its sum and
count before and after and how many of its values changed (what SQLMesh's ``table_diff`` and dbt's
``audit_helper`` show for two relations).

"Before" is main's rows of the job's range as the plan found them, "after" what main holds there once
the job is published. Neither side is read twice for this. Each unit, which holds its rows sorted
anyway, counts them (``*_after``) and, in replace mode, compares them with main's rows of its own
partition and buckets: in a partition of its own it reads them itself (`MainAtPlan`) and counts them
too (``*_before``); in a partition cut into several units, main tasks have read and counted them once
and spilled them by bucket, as the scan spills the source's, and the unit reads its buckets back.
Every task and unit leaves a small table of cells (`cell_schema`: one row per day and series it saw);
the job's diff is their sum per cell.

In merge mode main's rows stay as they are and the job's rows are added, so only the rows the job
wrote are counted by the units, and the cells say so (`finish`).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent

from timelake.model.contract import Contract
from timelake.model.layout import MainReader, SnapshotRange, dense_unique, micros, series_codes, single_array, tally
from timelake.model.lineage import Lineage, Origin, PlanMark
from timelake.model.timeutil import US_PER_DAY
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobState

KINDS = ("changed", "only_before", "only_after")  # the kinds of sample rows, side by side
SAMPLES = 5  # sample rows of each kind a task or unit keeps, and the job keeps per day
SERIES_SHOWN = 50  # series in a summary, most changed first (all of them are in the cells)
COUNTS = ("rows_before", "rows_after", "only_after", "in_both", "changed")  # what tasks and units count per cell
SUMMARY_COUNTS = ("rows_before", "rows_after", "only_before", "only_after", "in_both", "changed")
SAMPLES_KEY = b"timelake.diff-samples"  # where a facts file keeps its sample rows (its schema's metadata)
BEFORE_KEY = b"timelake.diff-before-rows"  # how many of a merge unit's cells, at the end, count main's rows


def compares(mode: str, diff: bool) -> bool:
    """Whether a job of ``mode`` computes its diff: replace and merge change main's range; append only adds."""
    return diff and mode in ("replace", "merge")


def compared_columns(schema: pa.Schema, contract: Contract) -> list[str]:
    """The columns whose values are compared between before and after: all but the dedup key (the rows are
    matched on it) and the series key."""
    keys = {*contract.dedup_key, *contract.series_key}
    return [name for name in schema.names if name not in keys]


def summable(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def cell_schema(columns: list[str]) -> pa.Schema:
    """The cells a task or unit counts: day (days since 1970-01-01, UTC), series label, the counts, and per
    compared column its sum and non-null count on each side and how many of its values changed."""
    fields = [pa.field("day", pa.int32()), pa.field("series", pa.string())]
    fields += [pa.field(name, pa.int64()) for name in COUNTS]
    for column in columns:
        fields += [pa.field(f"{column}.sum_before", pa.float64()), pa.field(f"{column}.count_before", pa.int64()),
                   pa.field(f"{column}.sum_after", pa.float64()), pa.field(f"{column}.count_after", pa.int64()),
                   pa.field(f"{column}.changed", pa.int64())]
    return pa.schema(fields)


def series_labels(rows: pa.Table, series_key: tuple[str, ...]) -> tuple[np.ndarray, pa.Array]:
    """Per row a code of its series and, by code, the series' label: its value as text, the values of a key
    of several columns joined by ``|``, "" for a table without a series key. A dictionary-encoded series
    column (a unit's, read from the spill; main's, read so) gives its codes as they are, int32 without a copy."""
    if not series_key:
        return np.zeros(rows.num_rows, dtype=np.int64), pa.array([""], pa.string())
    column = rows.column(series_key[0]) if len(series_key) == 1 else None
    if column is not None and pa.types.is_dictionary(column.type):
        single = single_array(column.unify_dictionaries() if isinstance(column, pa.ChunkedArray) else column)
        codes = single.indices.to_numpy(zero_copy_only=False)
        return codes if codes.dtype in (np.int32, np.int64) else codes.astype(np.int64), _text(single.dictionary)
    codes = series_codes(rows, series_key)
    if not len(codes):
        return codes, pa.array([], pa.string())
    _, first = np.unique(codes, return_index=True)
    firsts = rows.select(list(series_key)).take(pa.array(first))
    labels = _text(firsts.column(0)) if len(series_key) == 1 else pc.binary_join_element_wise(
        *[_text(firsts.column(name)) for name in series_key], "|")
    return codes, labels


def _text(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    values = single_array(values)
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    return pc.fill_null(values.cast(pa.string()), "")


def count_cells(columns: list[str], days: np.ndarray | int, codes: np.ndarray, labels: pa.Array,
                weights: dict[str, np.ndarray | None]) -> pa.Table:
    """Cells of rows: per row its UTC day (an int: every row's), its series code (an index into ``labels``)
    and its weight under some of `cell_schema`'s names (None: one per row; the others count nothing); one
    cell per (day, series) present."""
    schema = cell_schema(columns)
    if not len(codes):
        return schema.empty_table()
    width = max(len(labels), 1)
    if isinstance(days, int):
        day_values, combined = np.array([days], dtype=np.int64), codes
    else:
        day_values, day_index, _ = dense_unique(days)
        combined = codes if len(day_values) == 1 else day_index * width + codes  # a count per slot, no sort
    slots = len(day_values) * width
    rows = tally(combined, slots)
    present = np.flatnonzero(rows)
    sums = {name: rows[present] if w is None else tally(combined, slots, w)[present] for name, w in weights.items()}
    return cells_of(schema, day_values[present // width], labels.take(pa.array(present % width)), sums)


def before_cells(rows: pa.Table, columns: list[str], contract: Contract, days: np.ndarray | int | None = None,
                 series: tuple[np.ndarray, pa.Array] | None = None) -> pa.Table:
    """Main's rows counted per day and series (``days`` and ``series``, `series_labels`, when the caller
    has them): their number, and per compared column its sum and non-null count."""
    codes, labels = series if series is not None else series_labels(rows, contract.series_key)
    if days is None:
        days = pc.cast(rows.column(contract.time_column), pa.int64()).to_numpy(zero_copy_only=False) // US_PER_DAY
    weights: dict[str, np.ndarray | None] = {"rows_before": None}
    for column in columns:
        values, valid = weights_of(rows.column(column))
        weights[f"{column}.count_before"] = valid
        if values is not None:
            weights[f"{column}.sum_before"] = values
    return count_cells(columns, days, codes, labels, weights)


def _first_of_days(rows: pa.Table, days: np.ndarray | int, series: np.ndarray, labels: pa.Array, per_day: dict[int, int],
                  contract: Contract, columns: list[str]) -> list[dict[str, Any]]:
    """A few of main's rows of each day not sampled enough yet (``per_day``): the samples of a day the
    job removes whole."""
    if isinstance(days, int):  # all rows of one day
        present, index = np.array([days], dtype=np.int64), np.zeros(0, dtype=np.int64)
    else:
        present, index, _ = dense_unique(days)
    wanted = [i for i, d in enumerate(present.tolist()) if per_day.get(d, 0) < SAMPLES]
    found = []
    keys = list(contract.dedup_key)
    for i in wanted:
        day = int(present[i])
        need = SAMPLES - per_day.get(day, 0)
        at = np.arange(min(need, rows.num_rows)) if len(present) == 1 else np.flatnonzero(index == i)[:need]
        per_day[day] = per_day.get(day, 0) + len(at)
        for row_at, row in zip(at.tolist(), rows.select(keys + columns).take(pa.array(at)).to_pylist(), strict=True):
            found.append(sample({k: row[k] for k in keys}, contract.time_column, {c: row[c] for c in columns}, None,
                                labels[int(series[row_at])].as_py()))
    return found


class Before:
    """Main's rows counted per cell (`before_cells`), and where the diff may show them a few of each
    day, a read at a time: the "before" of a diff as a main task or a merge unit (`MainCounter`) leaves it."""

    def __init__(self, columns: list[str], contract: Contract, sampled: bool = True) -> None:
        """``sampled``: keep a few rows of each day, which the diff shows for a day the job removes whole."""
        self._columns = columns
        self._contract = contract
        self._sampled = sampled
        self._cells: list[pa.Table] = []
        self._samples: list[dict[str, Any]] = []
        self._per_day: dict[int, int] = {}

    def add(self, rows: pa.Table, days: np.ndarray | int) -> None:
        """Counts ``rows``, whose UTC day numbers are ``days`` (an int: all of them lie in that day)."""
        series, labels = series_labels(rows, self._contract.series_key)
        self._cells.append(before_cells(rows, self._columns, self._contract, days, (series, labels)))
        if self._sampled:
            self._samples += _first_of_days(rows, days, series, labels, self._per_day, self._contract, self._columns)

    def cells(self) -> pa.Table:
        """The counted cells. One read's (a unit's day of main) are as counted: the job's sum of the facts
        sorts them, so sorting here was a third of the time of writing them."""
        return self._cells[0] if len(self._cells) == 1 else combine(self._cells, self._columns)

    def write(self, uri: str, *, objects: ObjectIO) -> None:
        """The counted cells and samples as a facts file (`write_facts`)."""
        write_facts(uri, self.cells(), {"only_before": self._samples}, objects=objects)


class MainCounter(Before):
    """Main's rows as a merge unit that holds its partition whole reads them to drop the keys main holds,
    counted on the way: the diff's "before" of that partition without a main task reading it again.
    ``snapshot_id`` is the snapshot they were read at; the cut takes the count only if that is the
    plan's (`timelake.steps.plan.plan_main_tasks`), else a main task counts."""

    def __init__(self, main: MainReader, table: Any, columns: list[str], contract: Contract) -> None:
        super().__init__(columns, contract, sampled=False)  # a merge job removes no day: no sample of main is shown
        snapshot = table.current_snapshot()
        self.snapshot_id: int | None = snapshot.snapshot_id if snapshot is not None else None
        self._main = main

    def batches(self, table: Any, start_us: int, end_us: int) -> Iterator[pa.RecordBatch]:
        day = start_us // US_PER_DAY if start_us // US_PER_DAY == (end_us - 1) // US_PER_DAY else None  # a day's unit
        for batch in self._main.batches(table, start_us, end_us):
            if batch.num_rows:
                rows = pa.Table.from_batches([batch])
                self.add(rows, day if day is not None else micros(rows, self._contract.time_column) // US_PER_DAY)
            yield batch


def cells_of(schema: pa.Schema, days: np.ndarray, labels: pa.Array, sums: dict[str, np.ndarray]) -> pa.Table:
    """A cells table from its days, series labels and some columns' values (zero for the others)."""
    columns = []
    for f in schema:
        if f.name == "day":
            columns.append(pa.array(days.astype(np.int32), pa.int32()))
        elif f.name == "series":
            columns.append(labels)
        else:
            values = sums.get(f.name)
            values = np.zeros(len(days)) if values is None else values
            columns.append(pa.array(np.rint(values).astype(np.int64) if f.type == pa.int64() else values.astype(np.float64), f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def combine(tables: list[pa.Table], columns: list[str]) -> pa.Table:
    """Cells of several tasks and units added up per (day, series), sorted by day and series."""
    schema = cell_schema(columns)
    parts = [t for t in tables if t.num_rows]
    if not parts:
        return schema.empty_table()
    if len(parts) == 1:  # one counting's cells: one per (day, series), unless two series share a label
        cells = parts[0].cast(schema).sort_by([("day", "ascending"), ("series", "ascending")])
        if not _repeats(cells):
            return cells
    values = [f.name for f in schema if f.name not in ("day", "series")]
    same = [t if t.schema.equals(schema) else t.cast(schema) for t in parts]  # a cast a part cost a job's sum 17 of 43 ms
    summed = pa.concat_tables(same).group_by(["day", "series"]).aggregate([(v, "sum") for v in values])
    summed = summed.rename_columns([name.removesuffix("_sum") if name.endswith("_sum") and name.removesuffix("_sum") in values
                                    else name for name in summed.column_names])
    return summed.select(schema.names).cast(schema).sort_by([("day", "ascending"), ("series", "ascending")])


def _repeats(cells: pa.Table) -> bool:
    """Whether sorted cells hold a (day, series) twice."""
    if cells.num_rows < 2:
        return False
    day, series = cells.column("day").combine_chunks(), cells.column("series").combine_chunks()
    same = pc.and_(pc.equal(day.slice(1), day.slice(0, len(day) - 1)), pc.equal(series.slice(1), series.slice(0, len(series) - 1)))
    return bool(pc.any(same).as_py())


def finish(cells: pa.Table, columns: list[str], mode: str) -> pa.Table:
    """The diff's cells from the counted ones: a date per day, and the rows only before. In merge mode the
    units counted only what they add: main's rows stay, unchanged, beside them."""
    if mode == "merge":
        before = {name: cells.column(name) for name in ("rows_before", *(f"{c}.{s}_before" for c in columns for s in ("sum", "count")))}
        cells = _set(cells, "only_after", cells.column("rows_after"))
        cells = _set(cells, "rows_after", pc.add(cells.column("rows_after"), before["rows_before"]))
        cells = _set(cells, "in_both", before["rows_before"])
        for c in columns:
            for s in ("sum", "count"):
                cells = _set(cells, f"{c}.{s}_after", pc.add(cells.column(f"{c}.{s}_after"), before[f"{c}.{s}_before"]))
    only_before = pc.subtract(cells.column("rows_before"), cells.column("in_both"))
    days = pa.array(cells.column("day").to_numpy(zero_copy_only=False).astype("datetime64[D]"), pa.date32())
    cells = _set(cells, "day", days)
    return cells.add_column(cells.schema.get_field_index("only_after"), "only_before", only_before)


def _set(table: pa.Table, name: str, values: Any) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def summarize(days: pa.Table, series: pa.Table, columns: list[str], samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A finished diff as JSON from its cells grouped by day and by series (`grouped`): totals, per column,
    per day and the most changed series; the samples as they were kept (per day, `keep_samples`)."""
    totals = {name: int(pc.sum(days.column(name)).as_py() or 0) for name in SUMMARY_COUNTS}
    totals["unchanged"] = totals["in_both"] - totals["changed"]
    totals["days"], totals["series"] = days.num_rows, series.num_rows
    by_column = [_column(days, c, totals["in_both"]) for c in columns]
    by_day = [_group(row, columns) for row in days.to_pylist()]
    score = pc.add(pc.add(series.column("only_before"), series.column("only_after")), series.column("changed"))
    order = pc.sort_indices(pa.table({"score": score, "series": series.column("series")}),
                            sort_keys=[("score", "descending"), ("series", "ascending")])
    by_series = [_group(row, columns) for row in series.take(order).slice(0, SERIES_SHOWN).to_pylist()]
    return {"totals": totals, "by_column": by_column, "by_day": by_day, "by_series": by_series,
            "series_total": series.num_rows, "samples": samples}


def _column(cells: pa.Table, column: str, in_both: int) -> dict[str, Any]:
    def total(name: str) -> Any:
        return pc.sum(cells.column(f"{column}.{name}")).as_py() or 0

    changed = int(total("changed"))
    sum_before, sum_after = float(total("sum_before")), float(total("sum_after"))
    count_before, count_after = int(total("count_before")), int(total("count_after"))
    return {"column": column, "sum_before": _number(sum_before), "sum_after": _number(sum_after),
            "sum_delta": _number(sum_after - sum_before), "count_before": count_before, "count_after": count_after,
            "count_delta": count_after - count_before, "changed": changed,
            "match_share": None if not in_both else round((in_both - changed) / in_both, 6)}


def grouped(cells: pa.Table | list[pa.Table], by: str, columns: list[str]) -> pa.Table:
    """Finished cells (or tables grouped so before) summed per day or per series, in order."""
    values = [*SUMMARY_COUNTS, *(f"{c}.{s}" for c in columns for s in ("sum_before", "sum_after", "count_before", "count_after", "changed"))]
    parts = [t for t in (cells if isinstance(cells, list) else [cells]) if t.num_rows]
    if not parts:
        kind = pa.date32() if by == "day" else pa.string()
        return pa.table({by: pa.array([], kind), **{v: pa.array([], pa.float64()) for v in values}})
    table = pa.concat_tables([t.select([by, *values]).cast(parts[0].select([by, *values]).schema) for t in parts])
    summed = table.group_by([by]).aggregate([(v, "sum") for v in values])
    summed = summed.rename_columns([n.removesuffix("_sum") if n != by else n for n in summed.column_names])
    return summed.sort_by([(by, "ascending")])


def _group(row: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """One day's or series' totals, with each column's deltas and changed values."""
    key = "day" if "day" in row else "series"
    result: dict[str, Any] = {key: plain(row[key])}
    result.update({name: int(row[name]) for name in SUMMARY_COUNTS})
    result["columns"] = {c: {"sum_delta": _number(float(row[f"{c}.sum_after"]) - float(row[f"{c}.sum_before"])),
                             "count_delta": int(row[f"{c}.count_after"]) - int(row[f"{c}.count_before"]),
                             "changed": int(row[f"{c}.changed"])} for c in columns}
    return result


CHUNK = 1 << 20  # rows whose temporaries a pass holds at once


def runs(codes: list[np.ndarray], series_columns: int) -> np.ndarray:
    """Where the runs of one series and UTC day start among rows in the table's sort order (their sort
    codes: series key columns, then time): the cells of a unit are its runs, so counting them is a pass,
    not a sort. Found a chunk at a time, so the pass holds a run's start each and little else; a unit
    within one day (a day's or an hour's partition) looks at its series alone."""
    n = len(codes[series_columns]) if len(codes) > series_columns else 0
    if not n:
        return np.zeros(0, dtype=np.int64)
    times = codes[series_columns]
    one_day = int(times.min()) // US_PER_DAY == int(times.max()) // US_PER_DAY
    edges = [np.zeros(1, dtype=np.int64)]
    for i in range(0, n, CHUNK):
        j, lo = min(n, i + CHUNK), max(i - 1, 0)
        change = np.zeros(j - lo - 1, dtype=bool)
        if not one_day:
            days = times[lo:j] // US_PER_DAY
            change |= days[1:] != days[:-1]
        for column in codes[:series_columns]:
            part = column[lo:j]
            change |= part[1:] != part[:-1]
        edges.append(np.flatnonzero(change) + lo + 1)
    return np.concatenate(edges)


def kept_runs(starts: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """The runs' starts once the rows ``dropped`` marks are gone (merge mode's conflicts); a run left
    without rows goes. The marks are counted per run (`np.add.reduceat`), not listed: half the time of
    listing them a chunk at a time."""
    if not len(starts):
        return starts
    gone = np.add.reduceat(dropped.view(np.uint8), starts, dtype=np.int64)  # rows dropped in each run
    moved = starts - (np.cumsum(gone) - gone)
    ends = np.append(moved[1:], len(dropped) - int(gone.sum()))
    return moved[ends > moved]


def chunk_runs(starts: np.ndarray, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [i, j) of runs starting at ``starts``: where each run present starts within them, and its number."""
    first = int(np.searchsorted(starts, i, side="right")) - 1
    last = int(np.searchsorted(starts, j, side="left"))
    local = starts[first:last] - i
    local[0] = 0
    return local, np.arange(first, last)


def differs(before: pa.Array | pa.ChunkedArray, after: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Which values differ: a null and a value do, two nulls and two NaNs do not (the diff is about what a
    reader sees, and ``NaN = NaN`` is false in SQL only by its rules)."""
    same = pc.fill_null(pc.equal(before, after), False)
    same = pc.or_(same, pc.and_(pc.is_null(before), pc.is_null(after)))
    if pa.types.is_floating(before.type):
        same = pc.or_(same, pc.and_(pc.fill_null(pc.is_nan(before), False), pc.fill_null(pc.is_nan(after), False)))
    return ~_numpy(same)


def _numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return single_array(values).to_numpy(zero_copy_only=False)


def weights_of(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A column as weights to count cells with: its values (nulls as 0; None when it cannot be summed)
    and 1 where it holds a value (None when every row does)."""
    values = single_array(column)
    valid = None if values.null_count == 0 else _numpy(values.is_valid()).astype(np.float64)
    if not summable(values.type):
        return None, valid
    numbers = values if pa.types.is_floating(values.type) else values.cast(pa.float64())
    numbers = pc.fill_null(numbers, 0.0) if numbers.null_count else numbers
    return _numpy(numbers).astype(np.float64, copy=False), valid


def sample(key: dict[str, Any], time_column: str, before: dict[str, Any] | None, after: dict[str, Any] | None,
           series: str) -> dict[str, Any]:
    """A sample row side by side: its key, and its compared values before and after (None on a side that
    does not hold the row)."""
    when = key[time_column]
    return {"day": when.date().isoformat() if isinstance(when, datetime) else None, "series": series,
            "key": {k: plain(v) for k, v in key.items()},
            "before": None if before is None else {k: plain(v) for k, v in before.items()},
            "after": None if after is None else {k: plain(v) for k, v in after.items()}}


def keep_samples(found: list[dict[str, list[dict[str, Any]]]]) -> dict[str, list[dict[str, Any]]]:
    """The samples of several tasks and units: per kind, at most `SAMPLES` per day, ordered by day,
    series and key."""
    kept: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        rows = sorted((s for part in found for s in part.get(kind, [])),
                      key=lambda s: (s["day"] or "", s["series"], str(sorted(s["key"].items()))))
        per_day: dict[str | None, int] = {}
        kept[kind] = []
        for s in rows:
            if per_day.get(s["day"], 0) < SAMPLES:
                per_day[s["day"]] = per_day.get(s["day"], 0) + 1
                kept[kind].append(s)
    return kept


def plain(value: Any) -> Any:
    """A value as JSON holds it: times and dates as ISO text, bytes as text, NaN and infinities by name."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    return value


def _number(value: float) -> float | str:
    return plain(round(value, 9) if math.isfinite(value) else value)


def day_text(day: int) -> str:
    """Days since 1970-01-01 as an ISO date."""
    return str(np.datetime64(int(day), "D"))


def decoded_columns(rows: pa.Table) -> pa.Table:
    """``rows`` with dictionary-encoded columns decoded."""
    return pa.table({name: pc.cast(column, column.type.value_type) if pa.types.is_dictionary(column.type) else column
                     for name, column in zip(rows.column_names, rows.columns, strict=True)})


FACTS_SUFFIX = ".facts.arrow"


def facts_uri(rt: Runtime, job_id: str, kind: str, name: str) -> str:
    """Where a main task (``kind`` "main") or a unit ("units") keeps its cells and samples; ``"local"``: where
    earlier engines kept a merge unit's count of main's rows (`MainCounter`), now kept in its unit's facts."""
    return rt.staging_path(job_id, "diff", kind, f"{name}{FACTS_SUFFIX}")  # beside a main task's spill (t00000.arrow)


def write_facts(uri: str, cells: pa.Table, samples: dict[str, list[dict[str, Any]]], *, objects: ObjectIO,
                before: pa.Table | None = None) -> None:
    """A task's or unit's cells and sample rows as one Arrow IPC file: one object a unit, read back by the
    job's combine (thousands of them on S3: one request each). A few hundred cells, which Parquet's writer
    took 40 times as long to write (0.8 ms a file). ``before``: main's rows as a merge unit counted them
    (`MainCounter`), kept after its own cells in the same file, not in a second one (on S3 a PUT and a GET
    fewer a merge unit; on a local disk within the spread); the combine takes them only where the cut took
    that count."""
    fs, path = objects.filesystem(uri)
    objects.make_parent(fs, path)
    metadata = {SAMPLES_KEY: json.dumps(samples).encode()}
    if before is not None:  # noted even when main held no row there: the count is here, not in a file apart
        cells = pa.concat_tables([cells, before if before.schema.equals(cells.schema) else before.cast(cells.schema)])
        metadata[BEFORE_KEY] = str(before.num_rows).encode()
    table = cells.replace_schema_metadata(metadata)
    with fs.open_output_stream(path) as out, pa.ipc.new_file(out, table.schema) as writer:
        writer.write_table(table)


def read_facts(uri: str, *, objects: ObjectIO, before: bool = True) -> tuple[pa.Table, dict[str, list[dict[str, Any]]], bool] | None:
    """What `write_facts` wrote: the cells (without a merge unit's count of main's rows unless ``before``),
    the samples, and whether it held such a count. None when there is no such file. A job begun by an
    engine that wrote them as Parquet (``<name>.parquet`` beside) and resumed after an upgrade has its
    facts read from there."""
    fs, path = objects.filesystem(uri)
    try:
        with fs.open_input_file(path) as handle:
            table = pa.ipc.open_file(handle).read_all()
    except FileNotFoundError:
        try:
            with fs.open_input_file(path.removesuffix(FACTS_SUFFIX) + ".parquet") as handle:
                table = pq.read_table(handle)
        except FileNotFoundError:
            return None
    metadata = table.schema.metadata or {}
    samples = json.loads(metadata.get(SAMPLES_KEY, b"{}"))
    counted = metadata.get(BEFORE_KEY)
    table = table.replace_schema_metadata(None)
    return (table if before or counted is None else table.slice(0, table.num_rows - int(counted))), samples, counted is not None


def mark_of(state: JobState) -> PlanMark:
    """The snapshot of main a job's diff compares with: the plan's (a dry run's cut takes one of its own)."""
    return PlanMark(state["diff"]["base_snapshot_id"], state["diff"]["base_sequence_number"])


def rows_at_plan(table: Any, mark: PlanMark, job_id: str, files: set[str] | None = None,
                 rewrites: bool = True) -> tuple[int | None, Any]:
    """Where main's rows of the plan are now: the snapshot to read (the plan's, while the metadata keeps
    it) and a filter of its manifest entries: ``files`` of it (all, for None). Should another engine
    have expired that snapshot, main's current files that hold rows of the plan (`lineage`): the named
    files still there, and (``rewrites``) the files compactions wrote since."""
    at_plan = mark.snapshot_id is not None and table.snapshot_by_id(mark.snapshot_id) is not None
    if at_plan:
        return mark.snapshot_id, lambda entry: (files is None or entry.data_file.content != DataFileContent.DATA
                                                or entry.data_file.file_path in files)
    lineage = Lineage(table, mark, job_id)
    accepts = lineage.accepts((Origin.PLAN, Origin.REWRITE))

    def keep(entry: Any) -> bool:
        if not accepts(entry):
            return False
        if files is None or entry.data_file.content != DataFileContent.DATA or entry.data_file.file_path in files:
            return True
        return rewrites and lineage.origin(entry) == Origin.REWRITE

    return None, keep


class MainAtPlan:
    """Main's rows of a replace job's range as the plan found them, for the units that read their own
    partition's (`timelake.steps.diff`): planned once over the range (by the writers of one process
    together) and read per unit, a row group at a time, the series dictionary-encoded."""

    def __init__(self, table: Any, contract: Contract, state: JobState, job_id: str,
                 dictionaries: tuple[str, ...], *, objects: ObjectIO) -> None:
        self._args = (table, contract, state, job_id)
        self._dictionaries = dictionaries
        self._objects = objects
        self._plan: SnapshotRange | None = None
        self._lock = threading.Lock()

    def batches(self, start_us: int, end_us: int) -> Iterator[pa.Table]:
        table, contract, state, job_id = self._args
        lo, hi = max(start_us, state["range_start"]), min(end_us, state["range_end"])
        if lo >= hi:
            return iter(())
        with self._lock:
            if self._plan is None:
                snapshot_id, keep = rows_at_plan(table, mark_of(state), job_id)
                self._plan = SnapshotRange(table, contract.time_column, state["range_start"], state["range_end"],
                                           tuple(table.schema().as_arrow().names), snapshot_id, keep, objects=self._objects)
            plan = self._plan
        return (pa.Table.from_batches([b]) for b in plan.batches(lo, hi, self._dictionaries) if b.num_rows)
