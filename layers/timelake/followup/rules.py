"""Rules: thresholds on a column, optionally held for a minimum duration, evaluated as a real-time
evaluator would have evaluated them, and alarms that only the live path may raise.

A rule fires once per *episode*: a run of consecutive samples of one series that all meet the
condition. With a duration ``for`` it fires at the first sample of the run that is at least ``for``
after the run's first sample; without one, at the run's first sample. An event therefore depends
only on rows at or before its firing time, which is what makes a historical evaluation after a
backfill agree with what a live evaluator would have said had the data arrived on time.

Two callers, two outcomes:
- the live path (`Table.append`) evaluates the new rows and sends new events to the lake's alarm
  sink (SNS on AWS) and to the events table with ``source = 'live'``;
- a backfill never touches the sink. By default it evaluates nothing; with ``evaluate_rules`` it
  evaluates the published range after publish and writes the events table with
  ``source = 'backfill'``, replacing that job range's earlier backfill events in one commit.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import And, EqualTo, Reference
from pyiceberg.expressions.literals import literal

from timelake.model.commit import swap
from timelake.model.contract import Contract
from timelake.model.layout import fresh_schema, micros, read_range, series_codes, time_bounds, time_filter
from timelake.model.timeutil import US_PER_DAY, US_PER_SECOND, parse_duration
from timelake.ports.runtime import Runtime

RULES = "timelake.rules"
_TEXT = re.compile(r"^\s*(?P<name>[A-Za-z0-9_.-]+)\s*:\s*(?P<column>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>>=|<=|>|<)\s*"
                   r"(?P<threshold>[-+0-9.eE]+)\s*(?:for\s+(?P<for>\S+))?\s*(?:severity\s+(?P<severity>\w+))?\s*$")
TS = pa.timestamp("us", tz="UTC")


class Rule(BaseModel):
    """One threshold rule of a table's contract (stored as JSON in the ``timelake.rules`` property)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    column: str
    op: Literal[">", ">=", "<", "<="]
    threshold: float
    for_: str | None = Field(default=None, alias="for", description="ISO-8601 duration the condition must hold, e.g. PT10M")
    severity: str = Field(default="warning", pattern=r"^[A-Za-z0-9_-]{1,32}$")

    @field_validator("for_")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parts = parse_duration(value)
            if parts.get("years") or parts.get("months"):
                raise ValueError(f"rule duration '{value}' must be fixed-length (weeks, days, hours, minutes, seconds)")
        return value

    @property
    def hold_us(self) -> int:
        """The minimum duration in microseconds (0 without one)."""
        if self.for_ is None:
            return 0
        p = parse_duration(self.for_)
        seconds = p.get("weeks", 0) * 604_800 + p.get("days", 0) * 86_400 + p.get("hours", 0) * 3_600
        return int((seconds + p.get("minutes", 0) * 60 + p.get("seconds", 0)) * US_PER_SECOND)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def parse(definitions: Sequence[dict[str, Any] | str] | None, schema: pa.Schema) -> list[Rule]:
    """Rule definitions (dicts, or the CLI's text form) checked against the base table's schema."""
    rules = []
    for d in definitions or []:
        raw = parse_text(d) if isinstance(d, str) else d
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"rule {raw.get('name', '?')!r}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        field = schema.field(rule.column) if rule.column in schema.names else None
        if field is None or not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
            raise ValueError(f"rule '{rule.name}': column '{rule.column}' is not a numeric column of the table")
        rules.append(rule)
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"rule names must be unique, got {names}")
    return rules


def parse_text(text: str) -> dict[str, Any]:
    """``overheat: value > 90 for PT10M severity critical`` → a rule definition."""
    match = _TEXT.match(text)
    if match is None:
        raise ValueError(f"cannot read rule '{text}': write NAME: COLUMN OP THRESHOLD [for DURATION] [severity LEVEL], "
                         "e.g. 'overheat: value > 90 for PT10M'")
    d: dict[str, Any] = {k: v for k, v in match.groupdict().items() if v is not None}
    d["threshold"] = float(d["threshold"])
    return d


def rules_of(table: Any) -> list[Rule]:
    return [Rule.model_validate(d) for d in json.loads(table.properties.get(RULES, "[]"))]


def to_property(rules: list[Rule]) -> str:
    return json.dumps([r.to_json() for r in rules])


# --- the events table ------------------------------------------------------------------------------

def events_table_name(base: str) -> str:
    return f"{base}_events"


def events_schema(contract: Contract, schema: pa.Schema) -> pa.Schema:
    return pa.schema([
        pa.field("rule", pa.string(), nullable=False), pa.field("severity", pa.string(), nullable=False),
        *[pa.field(k, schema.field(k).type, nullable=False) for k in contract.series_key],
        pa.field("started_at", TS, nullable=False), pa.field("fired_at", TS, nullable=False),
        pa.field("value", pa.float64(), nullable=False), pa.field("threshold", pa.float64(), nullable=False),
        pa.field("source", pa.string(), nullable=False), pa.field("job_id", pa.string()),
        pa.field("recorded_at", TS, nullable=False),
    ])


def ensure_events_table(rt: Runtime, base: str, contract: Contract, schema: pa.Schema) -> Any:
    """The events table of ``base``, created (partitioned by the day an event fired) on first use."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    name = events_table_name(base)
    try:
        return rt.catalog.load_table(name)
    except NoSuchTableError:
        iceberg = fresh_schema(events_schema(contract, schema))
        spec = PartitionSpec(PartitionField(iceberg.find_field("fired_at").field_id, 1000, DayTransform(), "fired_day"))
        return rt.catalog.create_table(name, schema=iceberg, partition_spec=spec,
                                       properties={"timelake.events-of": base})


# --- evaluation ------------------------------------------------------------------------------------

def evaluate(rows: pa.Table, contract: Contract, rules: list[Rule], start_us: int | None, end_us: int | None) -> pa.Table:
    """Events of ``rules`` over ``rows`` that fire in [start, end), in the events schema minus the
    source/job/recorded columns, sorted by every column. ``rows`` must reach back far enough for each
    run's first sample (`context_rows` reads that).

    One sort of the rows by series and time, then one vectorised pass per rule over the rows that meet
    it: three window passes per rule in SQL took most of a refresh."""
    ts, series = micros(rows, contract.time_column), series_codes(rows, contract.series_key)
    order = np.lexsort((ts, series))  # stable: equal times keep the rows' order
    ts, series = ts[order], series[order]
    new_series = np.ones(len(ts), dtype=bool)
    new_series[1:] = series[1:] != series[:-1]
    columns = {}  # rules on the same column share its values in order
    for column in dict.fromkeys(rule.column for rule in rules):
        values, valid = _doubles(rows.column(column))
        columns[column] = values[order], valid[order]
    parts = []
    for rule in rules:
        values, valid = columns[rule.column]
        fired, started = _episodes(_meets(values, valid, rule), ts, new_series, rule.hold_us)
        inside = np.ones(len(fired), dtype=bool)
        if start_us is not None:
            inside &= ts[fired] >= start_us
        if end_us is not None:
            inside &= ts[fired] < end_us
        fired, started = fired[inside], started[inside]
        n = len(fired)
        parts.append(pa.table({
            "rule": pa.array([rule.name] * n, pa.string()), "severity": pa.array([rule.severity] * n, pa.string()),
            **{k: rows.column(k).take(pa.array(order[fired])) for k in contract.series_key},
            "started_at": pa.array(started, pa.int64()).cast(TS), "fired_at": pa.array(ts[fired], pa.int64()).cast(TS),
            "value": pa.array(values[fired], pa.float64()), "threshold": pa.array([rule.threshold] * n, pa.float64()),
        }))
    events = pa.concat_tables(parts)
    return events.sort_by([(name, "ascending") for name in events.column_names])


def _doubles(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column as float64 values and a validity mask (nulls never meet a condition)."""
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    return pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy(zero_copy_only=False), valid


def _meets(values: np.ndarray, valid: np.ndarray, rule: Rule) -> np.ndarray:
    """Which values meet the rule. NaN orders above every number and equals itself (as in DuckDB and
    Iceberg's sort order), so ``value > 80`` holds for NaN: a broken sensor reading NaN is not silence."""
    nan = np.isnan(values)
    if math.isnan(rule.threshold):
        above, equal = np.zeros(len(values), dtype=bool), nan
    else:
        above, equal = nan | (values > rule.threshold), ~nan & (values == rule.threshold)
    meets = {">": above, ">=": above | equal, "<": ~(above | equal), "<=": ~above}[rule.op]
    return meets & valid


def _episodes(hit: np.ndarray, ts: np.ndarray, new_series: np.ndarray, hold_us: int) -> tuple[np.ndarray, np.ndarray]:
    """Over rows in series and time order: the row at which each run of ``hit`` rows fires (its first
    row at least ``hold_us`` after the run began) and the run's first time."""
    rows = np.flatnonzero(hit)
    if len(rows) == 0:
        return rows, rows
    begins = np.ones(len(rows), dtype=bool)
    begins[1:] = (rows[1:] != rows[:-1] + 1) | new_series[rows[1:]]
    run = np.cumsum(begins) - 1
    started = ts[rows[begins]][run]
    held = np.flatnonzero(ts[rows] - started >= hold_us)
    first = held[np.concatenate([[True], run[held][1:] != run[held][:-1]])] if len(held) else held
    return rows[first], started[first]


def context_rows(table: Any, contract: Contract, rules: list[Rule], start_us: int, end_us: int) -> pa.Table:
    """The rows an exact evaluation of [start, end) needs: the range, plus as much history before it
    as it takes to find where each run in progress at the range's start began.

    It reads back the longest rule duration first, then doubles the look-back only while some series'
    earliest row read still meets a condition (its run may have begun earlier), so a normal backfill
    reads one short extra window and a long alarm episode costs reads proportional to its length.
    """
    columns = tuple(dict.fromkeys([*contract.series_key, contract.time_column, *(r.column for r in rules)]))
    lo = start_us - max(r.hold_us for r in rules)
    rows = read_range(table, contract.time_column, lo, end_us, columns)
    step, still_open = max(start_us - lo, US_PER_DAY), _open_series(rows, contract, rules)
    bounds = time_bounds(table, contract.time_column) if still_open else None  # the usual case needs no file listing
    first = bounds[0] if bounds else None
    while still_open and first is not None and lo > first:
        earlier = read_range(table, contract.time_column, max(lo - step, first), lo, columns)
        rows = pa.concat_tables([earlier.cast(rows.schema), rows])  # files may read as string or large_string
        lo, step = max(lo - step, first), step * 2
        still_open &= _open_series(rows, contract, rules)  # a series found closed stays closed
    return rows


def _open_series(rows: pa.Table, contract: Contract, rules: list[Rule]) -> set[tuple[Any, ...]]:
    """The series whose earliest row read meets some rule's condition: their run may have begun earlier.
    (Of rows tied for earliest, any one meeting a condition counts: reading back too far costs a read,
    never a wrong event.)"""
    if rows.num_rows == 0:
        return set()
    series = series_codes(rows, contract.series_key)
    ts = micros(rows, contract.time_column)
    earliest = np.full(int(series.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(earliest, series, ts)
    first = np.flatnonzero(ts == earliest[series])
    hit = np.zeros(len(first), dtype=bool)
    for rule in rules:
        values, valid = _doubles(rows.column(rule.column).take(pa.array(first)))
        hit |= _meets(values, valid, rule)
    keys = rows.select(list(contract.series_key)).take(pa.array(first[hit])).to_pylist()
    return {tuple(row[k] for k in contract.series_key) for row in keys}


def record(rt: Runtime, base: str, events: pa.Table, source: str, job_id: str | None,
           replace: tuple[int, int] | None = None) -> int:
    """Add ``events`` to the events table; with ``replace``, first remove this source's events that
    fired in that range, in the same commit (a re-run or a re-backfill of a range never duplicates)."""
    table = rt.load_table(base)
    contract = Contract.from_table(table)
    target = ensure_events_table(rt, base, contract, table.schema().as_arrow())
    schema = target.schema().as_arrow()
    now = pa.array([int(time.time() * US_PER_SECOND)] * events.num_rows, pa.int64()).cast(TS)
    rows = events.append_column("source", pa.array([source] * events.num_rows, pa.string())) \
        .append_column("job_id", pa.array([job_id] * events.num_rows, pa.string())) \
        .append_column("recorded_at", now).select(schema.names).cast(schema)
    if replace is None and rows.num_rows == 0:
        return 0
    row_filter = None
    if replace is not None:
        lo, hi = replace
        row_filter = And(EqualTo(term=Reference("source"), value=literal(source)), time_filter("fired_at", lo, hi))
    swap(target, row_filter, rows, f"events of {base}")
    return rows.num_rows


def evaluate_published(rt: Runtime, base: str, job_id: str, start_us: int, end_us: int,
                       spans: list[tuple[int, int]] | None = None) -> int:
    """Historical mode, after a publish: the events of [start, end) into the events table with
    ``source = 'backfill'``, in one commit. Never calls the alarm sink. Returns the number of events.

    ``spans`` cut the range into pieces evaluated one at a time (a published year, a day at a time),
    so memory is set by a piece, not by the job; each piece reads its own look-back, so the events are
    those of the whole range at once."""
    table = rt.load_table(base)
    rules = rules_of(table)
    if not rules:
        return 0
    contract = Contract.from_table(table)
    parts = [evaluate(context_rows(table, contract, rules, lo, hi), contract, rules, lo, hi)
             for lo, hi in (spans or [(start_us, end_us)])]
    events = parts[0] if len(parts) == 1 else pa.concat_tables(parts).sort_by(
        [(name, "ascending") for name in parts[0].column_names])
    return record(rt, base, events, "backfill", job_id, replace=(start_us, end_us))


# --- the live path ---------------------------------------------------------------------------------

def evaluate_live(rt: Runtime, base: str, new_rows: pa.Table) -> int:
    """After a live append: events that fire at the new rows' times, not recorded before, go to the
    events table (``source = 'live'``) and then to the alarm sink. Returns how many fired."""
    table = rt.load_table(base)
    rules = rules_of(table)
    if not rules or new_rows.num_rows == 0:
        return 0
    contract = Contract.from_table(table)
    ts = micros(new_rows, contract.time_column)
    lo, hi = int(ts.min()), int(ts.max()) + 1
    events = evaluate(context_rows(table, contract, rules, lo, hi), contract, rules, lo, hi)
    events = _not_recorded(rt, base, contract, events, lo, hi)
    if events.num_rows == 0:
        return 0
    record(rt, base, events, "live", None)
    for event in events.to_pylist():
        rt.alarms.notify(base, {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in event.items()})
    return events.num_rows


def _not_recorded(rt: Runtime, base: str, contract: Contract, events: pa.Table, lo: int, hi: int) -> pa.Table:
    """Drop events the live path already raised (same rule, series and firing time)."""
    import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
    try:
        known = rt.catalog.load_table(events_table_name(base)).scan(row_filter=And(
            EqualTo(term=Reference("source"), value=literal("live")), time_filter("fired_at", lo, hi))).to_arrow()
    except NoSuchTableError:
        return events
    if known.num_rows == 0 or events.num_rows == 0:
        return events
    keys = ["rule", *contract.series_key, "fired_at"]
    con = duckdb.connect()
    con.register("events", events)
    con.register("known", known.select(keys))
    return con.sql(f"SELECT * FROM events ANTI JOIN known USING ({', '.join(keys)}) ORDER BY ALL").to_arrow_table()
