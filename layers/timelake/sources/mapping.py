"""Mapping raw source batches onto the target table schema.

Everything that can be checked from schemas alone is checked when the mapper
is built, so that a wrong column map or a missing time zone fails before hours
of data are read. What can only be seen in the data (unparseable values, nulls,
local times that do not exist or occur twice) is handled per batch: bad values
stop the job with the file, row and value named, while rows that merely cannot
be placed are dropped and counted so the caller can decide how strict to be.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timelake.errors import MappingError
from timelake.model.issues import ISSUE_EXAMPLES, Issues
from timelake.model.timeutil import US_PER_DAY
from timelake.sources.base import SourceBatch

DstPolicy = Literal["refuse", "earliest", "latest", "drop", "infer"]
BadValue = Literal["fail", "null", "reject"]
"""What to do with naive local times that a DST switch makes nonexistent or ambiguous.

"earliest"/"latest" resolve them: an ambiguous time takes its first or second
occurrence, a nonexistent one the last microsecond before the gap or the first
instant after it (02:30 on a spring-forward night to 01:59:59.999999 or 03:00).
"drop" and "refuse" both drop the rows and count them; the caller fails a real
run on counted rows under "refuse" and only reports them in a dry run.
"infer" (the default) reads the answer from the source order, as exports
written in time order carry it: within each series of a piece, the first pass
through a repeated hour is the earlier instant and the pass after the clock
jumps back the later one; `Mapper.undetermined` lists the series and hours
where the order cannot tell. Nonexistent times count as under "refuse".
"earliest"/"latest" fold the two passes onto one instant: a repeated local
time of a series is kept once and the rest count as "dst_collapsed".
"""

# UTC microseconds plus the nonexistent and ambiguous masks (None when no local time was involved).
_Instants = tuple[pa.Array, pa.Array | None, pa.Array | None]
# Turns a position in the array being converted into "row N of file".
_Where = Callable[[int], str]

_UTC_US = pa.timestamp("us", tz="UTC")
_UTC_NAMES = {"UTC", "Etc/UTC", "+00:00", "Z"}
_TIME_UNITS = ("s", "ms", "us", "ns")
_POLICIES = ("refuse", "earliest", "latest", "drop", "infer")
_BAD_VALUE = ("fail", "null", "reject")
MAX_EXAMPLES = 5
# Day-first dotted dates (25.10.2026 02:30[:00]), as German and other European exports write them.
_DOTTED = r"^(\d{2})\.(\d{2})\.(\d{4})([ T]|$)"
# A clock time followed by Z or a numeric offset; a bare date never carries one.
_OFFSET = r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?)$"
# The shape of an ISO 8601 date and time Arrow may read (after the dotted rewrite); the rare value of this
# shape that is still no time (a 13th month) is found by bisection
_ISO = r"^[+-]?\d{4,}-\d{2}-\d{2}(?:[T ]\d{2}(?::\d{2}(?::\d{2}(?:[.,]\d*)?)?)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?)?$"
_SPECIAL_FLOAT = r"^[+-]?(?:inf|infinity|nan)$"
# What a bad value looks like (for counting and advice): something like a number, grouped in threes,
# with a decimal mark, or a date
_NUMBERISH = r"^\s*[+-]?[\d.,' \x{a0}\x{202f}]*\d[\d.,' \x{a0}\x{202f}]*(?:[eE][+-]?\d+)?\s*$"
_GROUPED = r"^\s*[+-]?\d{1,3}(?:([,.' \x{a0}\x{202f}])\d{3})(?:[,.' \x{a0}\x{202f}]\d{3})*(?:[.,]\d*)?\s*$"
_DECIMAL_MARK = r"^\s*[+-]?\d*[.,]\d+(?:[eE][+-]?\d+)?\s*$"
_KIND_TEXT = {"thousands separator": "a number grouped by a thousands separator",
              "decimal mark": "a number with another decimal mark", "text": "not a number"}
_DATE_LIKE = r"\d{1,4}[-/.][0-9A-Za-z]{1,9}[-/.]\d{1,4}|^\d{8}[T ]?\d{4,6}$"


@dataclass
class MappedBatch:
    """Rows ready to append (exactly the target schema) plus a tally of rows left out, with one example per reason.

    ``issues`` has the rows left out and the values nulled per column and kind; ``states`` counts the
    texts kept in the states column; ``dropped`` marks the source rows left out (None: none) and
    ``reasons`` says why per source row ("bad_value in value", null where kept), and ``times`` holds
    every source row's instant (null where it has none), so a caller can place them;
    ``issue_days`` counts rows left out or nulled per UTC day (days since 1970) where their time is known.
    """

    table: pa.Table
    rejected: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    issues: Issues = field(default_factory=Issues)
    states: Counter[str] = field(default_factory=Counter)
    dropped: pa.Array | None = None
    reasons: pa.Array | None = None
    times: pa.Array | None = None
    issue_days: Counter[int] = field(default_factory=Counter)


class Mapper:
    """Turns source batches into target-schema tables with a UTC microsecond time column.

    Each dropped row is counted once, under the first reason that applies, in
    the order bad_value, null_time, dst_nonexistent, dst_ambiguous, dst_collapsed,
    null_series_key, null_required. Columns are looked up by name in every batch rather than by
    position, so pieces whose schemas differ slightly (column order, a sparse
    JSON field) still map; ``filled_with_null`` lists the nullable table
    columns absent from the schema the mapper was built with.

    ``states_column``: a text column of the table that receives the text of values of its numeric
    columns that are no numbers at all (a historian's digital states: "I/O Timeout", "Shutdown"); the
    value itself is then null. A number written another way ("1,234.5") is never a state: it is a bad
    value, so a wrong --thousands or --decimal cannot hide rows in the states column.
    """

    def __init__(
        self,
        target: pa.Schema,
        source_schema: pa.Schema,
        *,
        time_column: str,
        series_key: list[str],
        column_map: dict[str, str] | None = None,
        tz: str | None = None,
        time_unit: str | None = None,
        dst_policy: DstPolicy = "refuse",
        on_bad_value: BadValue = "fail",
        decimal: str = ".",
        thousands: str | None = None,
        timestamp_format: str | None = None,
        states_column: str | None = None,
        keep_dictionary: tuple[str, ...] = (),
        fold_by: list[str] | None = None,
    ) -> None:
        """``keep_dictionary``: table columns that stay dictionary-encoded when the source gives them so
        (their values are cast, not each row), for a caller that would encode them again. ``fold_by``:
        the columns whose rows "infer" reads a clock change from in order (default: the series key; none
        for a wide export, whose lines carry every series at once, so a series blank through one pass of
        the repeated hour is still placed by the lines around it)."""
        self.target = target
        self._empty = target.empty_table()  # each batch's result until its rows are placed: built once, not a batch
        self.keep_dictionary = set(keep_dictionary)
        self.time_column = time_column
        self.series_key = list(series_key)
        self.fold_by = self.series_key if fold_by is None else list(fold_by)
        self.tz = tz
        self.time_unit = time_unit
        self.dst_policy = dst_policy
        self.on_bad_value = on_bad_value
        self.decimal = decimal
        self.thousands = thousands
        self.timestamp_format = timestamp_format
        self.states_column = states_column
        # (piece, series, local day) -> [latest local time of the first pass, of the second pass or None]
        self._folds: dict[tuple, list] = {}
        self._seen_local: set[tuple] = set()
        self._undetermined: dict[tuple, str] = {}
        column_map = dict(column_map or {})
        table_columns = ", ".join(target.names)
        for name in [*column_map, time_column, *self.series_key]:
            if name not in target.names:
                raise MappingError(f"'{name}' is not a column of the table (table columns: {table_columns})")
        available = source_schema.names
        listing = ", ".join(available) or "none"
        for name, source in column_map.items():
            if source not in available:
                raise MappingError(
                    f"column '{name}' is mapped to source column '{source}', which does not exist "
                    f"(source columns: {listing})"
                )
        self._check_options()
        self.source_of: dict[str, str] = {f.name: column_map.get(f.name, f.name) for f in target}
        self.filled_with_null: list[str] = [n for n, s in self.source_of.items() if s not in available]
        self.ignored_source_columns: list[str] = [n for n in available if n not in self.source_of.values()]
        self._keys = [time_column, *self.series_key]
        self._required = [f.name for f in target if not f.nullable and f.name not in self._keys]
        if states_column is not None:
            self.filled_with_null = [n for n in self.filled_with_null if n != states_column]
        for name in self.filled_with_null:
            if name in self._keys or name in self._required:
                raise MappingError(
                    f"column '{name}' (source '{self.source_of[name]}') is required but missing from the source "
                    f"(source columns: {listing})"
                )
        for name, source in self.source_of.items():
            if source in available:
                self._check_type(name, source_schema.field(source).type)

    def apply(self, batch: SourceBatch) -> MappedBatch:
        """Map one batch; raises MappingError on the first value that cannot be converted (under "fail")."""
        where = batch.where
        raw = {f.name: self._prepared(batch, f) for f in self.target}
        (when, nonexistent, ambiguous), bad_time = self._instants(raw[self.time_column], where)
        bad: dict[str, pa.Array] = {self.time_column: bad_time}
        values: dict[str, pa.Array] = {}
        for f in self.target:
            if f.name != self.time_column:
                values[f.name], bad[f.name] = self._cast(f, raw[f.name])
        bad = {name: mask for name, mask in bad.items() if mask is not None and pc.any(mask).as_py()}
        states = self._states(raw, bad) if self.states_column is not None else None
        if self.on_bad_value == "fail" and bad:
            name = self.time_column if self.time_column in bad else next(n for n in self.target.names if n in bad)
            self._fail(name, raw[name], pc.index(bad[name], True).as_py(), where)
        rejecting = self.on_bad_value == "reject"
        collapsed = None
        if ambiguous is not None and self.dst_policy in ("infer", "earliest", "latest"):
            ambiguous = pc.fill_null(ambiguous, False)
            if pc.any(ambiguous).as_py():
                if self.dst_policy == "infer":
                    when = self._infer(batch, when, ambiguous)
                else:
                    collapsed = self._collapsed(batch, when, ambiguous)
            ambiguous = None
        checks = [
            *(("bad_value", n, mask) for n, mask in bad.items() if rejecting or n == self.time_column),
            ("null_time", self.time_column, _nulls(when)),
            ("dst_nonexistent", self.time_column, nonexistent),
            ("dst_ambiguous", self.time_column, ambiguous),
            ("dst_collapsed", self.time_column, collapsed),
            *(("null_series_key", n, _nulls(self._column(batch, n))) for n in self.series_key),
            *(("null_required", n, _nulls(values[n])) for n in self._required),
        ]
        result = MappedBatch(self._empty, times=when)
        dropped: pa.Array | None = None
        for reason, name, mask in checks:
            if mask is None:
                continue
            mask = pc.fill_null(mask, False)
            if dropped is not None:
                mask = pc.and_(mask, pc.invert(dropped))
            if count := pc.sum(mask).as_py():
                result.rejected[reason] += count
                for i in pc.indices_nonzero(mask)[: MAX_EXAMPLES if reason == "bad_value" else 1].to_pylist():
                    value = raw[name][i].as_py()
                    value = "null" if value is None else value
                    add_example(result.examples, reason, f"{where(i)}: {self.source_of[name]}={value}")
                self._tally(result.issues, "rejected", name, raw[name], mask, reason, where)
                dropped = mask if dropped is None else pc.or_(dropped, mask)
                why = pa.scalar(f"{reason} in {self.source_of[name]}")
                result.reasons = pc.if_else(mask, why, result.reasons if result.reasons is not None else
                                            pa.nulls(len(mask), pa.string()))
        keep = pc.invert(dropped) if dropped is not None else None
        nulled = None
        if self.on_bad_value == "null":
            for name, mask in bad.items():
                if name != self.time_column:
                    mask = mask if keep is None else pc.and_(mask, keep)
                    if pc.any(mask).as_py():
                        self._tally(result.issues, "nulled", name, raw[name], mask, "bad_value", where)
                        nulled = mask if nulled is None else pc.or_(nulled, mask)
        lost = dropped if nulled is None else nulled if dropped is None else pc.or_(dropped, nulled)
        if lost is not None:
            placed = pc.cast(when.filter(lost), pa.int64()).drop_null().to_numpy()
            days, counts = np.unique(np.floor_divide(placed, US_PER_DAY), return_counts=True)
            result.issue_days.update(dict(zip(days.tolist(), counts.tolist(), strict=True)))
        if states is not None:
            kept = states if keep is None else states.filter(keep)
            counted = kept.drop_null().value_counts()
            result.states.update(dict(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True)))
        arrays, fields = [], []
        for f in self.target:
            column = when if f.name == self.time_column else values[f.name]
            if f.name == self.states_column and states is not None:
                column = pc.coalesce(states, column)
            column = column if keep is None else column.filter(keep)
            arrays.append(column)
            fields.append(f.with_type(column.type))
        result.table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=self.target.metadata))
        result.dropped = dropped
        return result

    def _cast(self, target: pa.Field, values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        """``values`` as the table column's type, and where they cannot be (None: everywhere they can); a
        value that cannot is null in the result. A column of dictionary codes is cast on its dictionary."""
        if pa.types.is_dictionary(values.type):
            if target.name in self.keep_dictionary:
                cast, mask = self._cast(target, values.dictionary)
                coded = pa.DictionaryArray.from_arrays(values.indices, cast, safe=False)  # the indices of a valid array
                return coded, None if mask is None else pc.fill_null(mask.take(values.indices), False)
            values = values.dictionary_decode()
        try:
            return pc.cast(values, target.type, safe=True), None
        except pa.ArrowNotImplementedError as e:
            column = f"column '{target.name}' (source '{self.source_of[target.name]}')"
            raise MappingError(f"{column} cannot be converted from {values.type} to {target.type}") from e
        except pa.ArrowInvalid:
            pass
        mask = None
        if _is_text(values.type) and (pa.types.is_floating(target.type) or pa.types.is_integer(target.type)):
            mask = _not_numbers(values, pa.types.is_integer(target.type))
        return _cast_rest(values, mask, lambda v: pc.cast(v, target.type, safe=True))

    def _states(self, raw: dict[str, pa.Array], bad: dict[str, pa.Array]) -> pa.Array | None:
        """The states column's text per row (null where none) from the bad values of the numeric columns
        that are no numbers; those leave ``bad``, their values stay null. Only the bad values are looked at."""
        found = None
        for f in self.target:
            mask = bad.get(f.name)
            if mask is None or f.name == self.time_column or not _numeric(f.type) or not _is_text(raw[f.name].type):
                continue
            text = pc.utf8_trim_whitespace(_plain_text(raw[f.name]).filter(mask))
            is_state = pc.invert(pc.match_substring_regex(text, _NUMBERISH))
            if not pc.any(is_state).as_py():
                continue
            rest = pc.replace_with_mask(mask, mask, pc.invert(is_state))
            if pc.any(rest).as_py():
                bad[f.name] = rest
            else:
                del bad[f.name]
            this = pc.replace_with_mask(pa.nulls(len(mask), text.type), mask,
                                        pc.if_else(is_state, text, pa.scalar(None, text.type)))
            found = this if found is None else pc.binary_join_element_wise(found, this, "; ", null_handling="skip")
        target = self.target.field(self.states_column).type
        return None if found is None else pc.cast(found, target)

    def _tally(self, issues: Issues, action: str, name: str, raw: pa.Array, mask: pa.Array, reason: str,
               where: _Where) -> None:
        """Add the rows of ``mask`` to ``issues`` under ``name`` and their kind, with distinct examples."""
        at = pc.indices_nonzero(mask)
        if reason != "bad_value":
            shown = [f"{where(i)}" for i in at[:ISSUE_EXAMPLES].to_pylist()]
            issues.add(action, name, reason, len(at), shown)
            return
        text = _plain_text(raw).take(at)
        kinds = self._kinds(name, text)
        for kind in pc.unique(kinds).to_pylist():
            mine = pc.equal(kinds, kind)
            these, positions = text.filter(mine), at.filter(mine)
            distinct = pc.unique(these)[:ISSUE_EXAMPLES]
            first = pc.index_in(distinct, value_set=these).to_pylist()
            examples = [f"{v!r} ({where(positions[i].as_py())})" for v, i in zip(distinct.to_pylist(), first, strict=True)]
            fix = self._fix(name, kind, distinct[0].as_py()) if len(distinct) else None
            issues.add(action, name, kind, len(these), examples, fix)

    def _kinds(self, name: str, text: pa.Array) -> pa.Array:
        """What each bad value of column ``name`` looks like (a vectorized guess, for the tally)."""
        if not _is_text(text.type):
            return pa.array(["unreadable"] * len(text))
        text = pc.utf8_trim_whitespace(text)
        if name == self.time_column:
            dated = pc.match_substring_regex(text, _DATE_LIKE)
            return pc.if_else(dated, "timestamp format", "not a time")
        if not _numeric(self.target.field(name).type):
            return pa.array(["unreadable"] * len(text))
        grouped = pc.match_substring_regex(text, _GROUPED)
        marked = pc.match_substring_regex(text, _DECIMAL_MARK)
        numberish = pc.match_substring_regex(text, _NUMBERISH)
        return pc.if_else(grouped, "thousands separator", pc.if_else(
            marked, "decimal mark", pc.if_else(numberish, "unreadable number", "text")))

    def _fix(self, name: str, kind: str, value: str | None) -> str | None:
        """The option that reads a value of ``kind`` like ``value``, as a person would type it."""
        if value is None:
            return None
        if kind == "timestamp format":
            return timestamp_hint(value)
        if kind in ("thousands separator", "decimal mark", "unreadable number"):
            return number_hint(value, self.decimal, self.thousands)
        if kind == "text":
            return (f"--states-column NAME keeps such states; --null-values '{value}' reads it as no value"
                    if self.states_column is None else f"--null-values '{value}' reads it as no value")
        return None

    def _fail(self, name: str, values: pa.Array, index: int, where: _Where) -> None:
        """The error for the first bad value of column ``name``: what, where, and the option that reads it."""
        value = _plain_text(values)[index] if _is_text(values.type) or pa.types.is_dictionary(values.type) else values[index]
        to = _UTC_US if name == self.time_column else self.target.field(name).type
        column = f"column '{name}' (source '{self.source_of[name]}')"
        single = value.as_py()
        if name == self.time_column and isinstance(single, str):
            reason = "not an ISO 8601 date and time" if self.timestamp_format is None else (
                f"does not match timestamp_format {self.timestamp_format!r}")
        else:
            try:
                pc.cast(pa.array([single], values.type.value_type if pa.types.is_dictionary(values.type)
                                 else values.type), to, safe=True)
                reason = "out of range"
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                reason = str(e)
        hint = None
        if isinstance(single, str):
            kind = self._kinds(name, pa.array([single])).to_pylist()[0]
            hint = self._fix(name, kind, single)
            reason = _KIND_TEXT.get(kind, reason) if name != self.time_column else reason
        rest = "--on-bad-value null or reject loads the rest, up to --max-rejected"
        advice = f"{hint}, or {rest}" if hint else rest
        raise MappingError(f"{column}: cannot convert {single!r} at {where(index)} to {to}: {reason} ({advice})")

    def utc_bounds(self, bounds: list[tuple[pa.DataType, int, int]]) -> list[tuple[int, int] | None]:
        """UTC microseconds of the least and greatest source time value of each file (its footer statistics:
        source type and the integers stored), when the time column's conversion keeps order exactly (an
        absolute timestamp, an epoch integer), so every row of the file maps inside them; None for text and
        local times (a DST fold may reorder them). The files of one type are converted together: a
        conversion per file was most of planning a source of a few hundred files."""
        spans: list[tuple[int, int] | None] = [None] * len(bounds)
        by_type: dict[pa.DataType, list[int]] = {}
        for i, (source_type, _, _) in enumerate(bounds):
            by_type.setdefault(source_type, []).append(i)
        for source_type, files in by_type.items():
            absolute = pa.types.is_timestamp(source_type) and source_type.tz is not None
            if not (absolute or (pa.types.is_integer(source_type) and self.time_unit)):
                continue
            stored = pa.array([value for i in files for value in bounds[i][1:]], pa.int64()).cast(source_type)
            (when, _, _), _ = self._instants(stored, lambda i: "the footer statistics")
            micros = pc.cast(when, pa.int64()).to_pylist()
            for i, low_us, high_us in zip(files, micros[0::2], micros[1::2], strict=True):
                spans[i] = (low_us, high_us) if low_us is not None and high_us is not None else None
        return spans

    def undetermined(self) -> list[str]:
        """Series and hours where "infer" could not tell the passes apart: a single pass through the
        repeated hour, or a series not in time order there. Complete once every batch is mapped."""
        for (piece, key, _day), (_first, second) in self._folds.items():
            if second is None:
                self._undetermined.setdefault((piece, key, _day), self._fold_name(piece, key, _first))
        return list(self._undetermined.values())

    def _fold_name(self, piece: str, key: tuple, local_us: int) -> str:
        series = ", ".join(f"{n}={v}" for n, v in zip(self.fold_by, key, strict=True))
        hour = pa.scalar(local_us - local_us % 3_600_000_000, pa.timestamp("us")).as_py()
        return f"{f'series {series}' if series else 'the lines'} at {hour:%Y-%m-%d %H:%M} local in {piece}"

    def _ambiguous_rows(self, batch: SourceBatch, when: pa.Array, ambiguous: pa.Array, columns: list[str]) -> tuple:
        """Positions, local wall-clock microseconds and keys (values of ``columns``) of the ambiguous rows,
        in source order."""
        at = pc.indices_nonzero(ambiguous)
        local = pc.local_timestamp(when.take(at).cast(pa.timestamp("us", self.tz))).cast(pa.int64()).to_pylist()
        keys = list(zip(*(self._column(batch, n).take(at).to_pylist() for n in columns), strict=True))
        return at.to_numpy(), local, keys if columns else [()] * len(local)

    def _infer(self, batch: SourceBatch, when: pa.Array, ambiguous: pa.Array) -> pa.Array:
        """The later instant for rows after the wall clock went back within a series' repeated hour."""
        at, local, keys = self._ambiguous_rows(batch, when, ambiguous, self.fold_by)
        later = np.zeros(len(when), dtype=bool)
        for position, value, key in zip(at, local, keys, strict=True):
            fold = (batch.origin, key, value // 86_400_000_000)
            state = self._folds.setdefault(fold, [value, None])
            if state[1] is None and value < state[0]:
                state[1] = value
            elif state[1] is None:
                state[0] = max(state[0], value)
            elif value < state[1]:
                self._undetermined.setdefault(fold, self._fold_name(batch.origin, key, value))
            else:
                state[1] = value
            later[position] = state[1] is not None
        local_all = pc.local_timestamp(when.cast(pa.timestamp("us", self.tz)))
        late = pc.assume_timezone(local_all, self.tz, ambiguous="latest", nonexistent="latest").cast(_UTC_US)
        return pc.if_else(pa.array(later), late, when)

    def _collapsed(self, batch: SourceBatch, when: pa.Array, ambiguous: pa.Array) -> pa.Array:
        """Rows whose local time a series already had in the repeated hour: folded onto the same instant."""
        at, local, keys = self._ambiguous_rows(batch, when, ambiguous, self.series_key)
        mask = np.zeros(len(when), dtype=bool)
        for position, value, key in zip(at, local, keys, strict=True):
            seen = (batch.origin, key, value)
            mask[position] = seen in self._seen_local
            self._seen_local.add(seen)
        return pa.array(mask)

    def _check_options(self) -> None:
        time_type = self.target.field(self.time_column).type
        if not (pa.types.is_timestamp(time_type) and time_type.unit == "us" and time_type.tz in _UTC_NAMES):
            raise MappingError(f"table time column '{self.time_column}' is {time_type}, expected {_UTC_US}")
        if self.dst_policy not in _POLICIES:
            raise MappingError(f"unknown dst_policy '{self.dst_policy}': use one of {', '.join(_POLICIES)}")
        if self.on_bad_value not in _BAD_VALUE:
            raise MappingError(f"unknown on_bad_value '{self.on_bad_value}': use one of {', '.join(_BAD_VALUE)}")
        if self.thousands is not None and (len(self.thousands) != 1 or self.thousands.isalnum() or self.thousands == self.decimal):
            raise MappingError(f"thousands separator {self.thousands!r}: one character, not a digit, not the decimal mark")
        if self.states_column is not None:
            names = self.target.names
            if self.states_column not in names:
                raise MappingError(f"states column '{self.states_column}' is not a column of the table (table columns: "
                                   f"{', '.join(names)}); add a string column for the states")
            kind = self.target.field(self.states_column).type
            if not _is_text(kind) or self.states_column in (self.time_column, *self.series_key):
                raise MappingError(f"states column '{self.states_column}' is {kind}"
                                   f"{' and part of the key' if _is_text(kind) else ''}: it needs a string column "
                                   "of its own")
        if self.time_unit is not None and self.time_unit not in _TIME_UNITS:
            raise MappingError(f"unknown time_unit '{self.time_unit}': use one of {', '.join(_TIME_UNITS)}")
        if self.tz is not None:
            try:
                pc.assume_timezone(pa.array([0], pa.timestamp("us")), self.tz)
            except pa.ArrowInvalid as e:
                raise MappingError(f"unknown time zone '{self.tz}': {e}") from e

    def _check_type(self, name: str, source_type: pa.DataType) -> None:
        """Reject conversions that no value could survive, before any data is read."""
        where = f"column '{name}' (source '{self.source_of[name]}')"
        if name != self.time_column:
            try:
                pa.array([], source_type).cast(self.target.field(name).type)
            except pa.ArrowNotImplementedError as e:
                target_type = self.target.field(name).type
                raise MappingError(f"{where} cannot be converted from {source_type} to {target_type}") from e
            return
        if pa.types.is_dictionary(source_type):
            source_type = source_type.value_type
        if pa.types.is_integer(source_type) and self.time_unit is None:
            raise MappingError(
                f"{where} holds integers: pass time_unit=... (--time-unit) with s, ms, us or ns "
                "to say what they count since 1970-01-01 UTC"
            )
        naive = pa.types.is_date(source_type) or pa.types.is_timestamp(source_type) and source_type.tz is None
        if naive and not self.tz:
            raise MappingError(_naive_message(where))
        kinds = (pa.types.is_integer, pa.types.is_date, pa.types.is_timestamp, pa.types.is_string,
                 pa.types.is_large_string, pa.types.is_null)
        if not any(is_kind(source_type) for is_kind in kinds):
            raise MappingError(f"{where} is {source_type}: expected timestamps, ISO 8601 strings or epoch integers")

    def _prepared(self, batch: SourceBatch, target: pa.Field) -> pa.Array:
        """The source column, with thousands separators dropped and a decimal comma turned into a point where
        the table wants numbers. A separator is dropped only from a number grouped by it (``1,234,567.5``),
        so a value such as ``1,2`` stays as it is and is counted as bad, not read as 12; only the values that
        hold the separator are looked at."""
        values = self._column(batch, target.name)
        if not (_is_text(values.type) and _numeric(target.type)):
            return values
        values = _plain_text(values)
        if self.thousands is not None:
            has = pc.fill_null(pc.match_substring(values, self.thousands), False)
            if pc.any(has).as_py():
                held = values.filter(has)
                grouped = pc.match_substring_regex(held, _grouped_by(self.thousands, self.decimal))
                values = pc.replace_with_mask(values, has, pc.if_else(grouped, pc.replace_substring(held, self.thousands, ""), held))
        if self.decimal != "." and not pa.types.is_integer(target.type):
            values = pc.replace_substring(values, self.decimal, ".")
        return values

    def _column(self, batch: SourceBatch, name: str) -> pa.Array:
        source = self.source_of[name]
        index = batch.data.schema.get_field_index(source)
        if index >= 0:
            return batch.data.column(index)
        if name in self._keys or name in self._required:
            raise MappingError(f"column '{name}' (source '{source}') is required but missing from {batch.origin}")
        return pa.nulls(batch.data.num_rows, self.target.field(name).type)

    def _instants(self, values: pa.Array, where: _Where) -> tuple[_Instants, pa.Array | None]:
        """UTC microseconds of the time column (with the nonexistent and ambiguous masks of local times), and
        the mask of values that are no time (None: every value is one, or null).

        Text is parsed once per distinct value: exports repeat each timestamp for every series on its
        line, so a file of 2M rows holds a few tens of thousands of them. Dispatch is on each batch's own
        type, not the construction-time schema: pieces may differ."""
        self._check_type(self.time_column, values.type)
        kind = values.type
        if pa.types.is_dictionary(kind) or _is_text(kind):
            coded = values if pa.types.is_dictionary(kind) else pc.dictionary_encode(values)
            (when, nonexistent, ambiguous), bad = self._parse(coded.dictionary, where, coded.indices)
            at = coded.indices

            def per_row(mask: pa.Array | None) -> pa.Array | None:  # a mask of no distinct value is none of a row
                return None if mask is None or not pc.any(mask).as_py() else pc.fill_null(mask.take(at), False)

            return (when.take(at), per_row(nonexistent), per_row(ambiguous)), per_row(bad)
        if pa.types.is_null(kind):
            return (pa.nulls(len(values), _UTC_US), None, None), None
        if pa.types.is_integer(kind):
            unit = pa.timestamp(self.time_unit, "UTC")
            as_time, bad = _cast_rest(values, None, lambda v: _to_us(v.cast(pa.int64()).cast(unit)))
            return (as_time, None, None), bad
        if pa.types.is_timestamp(kind) and kind.tz is not None:
            return (_to_us(values.cast(pa.timestamp(kind.unit, "UTC"))), None, None), None
        if pa.types.is_date(kind):
            values = values.cast(pa.timestamp("us"))
        return self._localize(_to_us(values)), None

    def _parse(self, text: pa.Array, where: _Where, rows: pa.Array) -> tuple[_Instants, pa.Array | None]:
        """Distinct text values as instants: with the job's strptime format, or ISO 8601, where an offset makes
        a value absolute and otherwise it is local time in ``tz``; and the mask of those that are no time.

        Fraction digits beyond microseconds are cut off in the text, which floors the instant and keeps
        the full microsecond date range (parsing as nanoseconds would limit it to 1677-2262). Naive values
        without a zone are refused, naming one (``rows``: the batch's positions of the distinct values,
        to say where)."""
        text = original = pc.utf8_trim_whitespace(text)
        nothing = pa.scalar(None, text.type)
        if self.timestamp_format is not None:
            parsed = pc.strptime(text, format=self.timestamp_format, unit="us", error_is_null=True)
            bad = pc.and_(pc.is_valid(text), pc.is_null(parsed))
            if parsed.type.tz is not None:
                return (parsed.cast(_UTC_US), None, None), bad
            self._need_zone(text, parsed, where, rows, bad)
            return self._localize(parsed), bad
        text = pc.replace_substring_regex(text, _DOTTED, r"\3-\2-\1\4")
        text = pc.replace_substring_regex(text, r"(\.\d{6})\d+", r"\1")
        shaped = pc.and_kleene(pc.is_valid(text), pc.invert(pc.match_substring_regex(text, _ISO)))
        absolute = pc.fill_null(pc.match_substring_regex(text, _OFFSET), False)
        candidates = pc.if_else(shaped, nothing, text)
        aware, bad_aware = _cast_rest(pc.if_else(absolute, candidates, nothing), None, lambda v: v.cast(_UTC_US))
        naive, bad_naive = _cast_rest(pc.if_else(absolute, nothing, candidates), None,
                                      lambda v: v.cast(pa.timestamp("us")))
        bad = shaped
        for more in (bad_aware, bad_naive):
            if more is not None:
                bad = pc.or_(bad, more)
        self._need_zone(original, naive, where, rows, bad)
        if naive.null_count == len(naive):
            return (aware, None, None), bad
        when, nonexistent, ambiguous = self._localize(naive)
        return (pc.coalesce(aware, when), nonexistent, ambiguous), bad

    def _need_zone(self, text: pa.Array, naive: pa.Array, where: _Where, rows: pa.Array, bad: pa.Array) -> None:
        """Refuse naive times without ``tz``, unless a value that is no time at all comes first under "fail"
        (it says so: column, file, value, rather than asking for a zone it would not need). ``rows``: the
        batch's codes of the distinct values; only the batch's own rows count."""
        if self.tz is not None or naive.null_count == len(naive):
            return
        shown = text.take(rows)
        row_bad = pc.fill_null(bad.take(rows), False)
        if self.on_bad_value == "fail" and pc.any(row_bad).as_py():
            self._fail(self.time_column, shown, pc.index(row_bad, True).as_py(), where)
        row_naive = pc.fill_null(pc.is_valid(naive).take(rows), False)
        if pc.any(row_naive).as_py():
            i = pc.index(row_naive, True).as_py()
            column = f"column '{self.time_column}' (source '{self.source_of[self.time_column]}')"
            raise MappingError(_naive_message(column, f"{shown[i].as_py()!r} at {where(i)}"))

    def _localize(self, naive: pa.Array) -> _Instants:
        """Local wall-clock time to UTC, flagging times a DST switch skipped or repeated.

        Resolving every value both ways exposes them: the two answers differ
        exactly at such times, and only a skipped time fails to come back
        unchanged when the later answer is turned back into wall-clock time.
        """
        early = pc.assume_timezone(naive, self.tz, ambiguous="earliest", nonexistent="earliest")
        late = pc.assume_timezone(naive, self.tz, ambiguous="latest", nonexistent="latest")
        shifted = pc.not_equal(early, late)
        nonexistent = pc.and_(shifted, pc.not_equal(pc.local_timestamp(late), naive))
        ambiguous = pc.and_(shifted, pc.invert(nonexistent))
        if self.dst_policy in ("earliest", "latest"):
            return (early if self.dst_policy == "earliest" else late).cast(_UTC_US), None, ambiguous
        return early.cast(_UTC_US), nonexistent, ambiguous


_SEVERAL = ("bad_value", "bad_line")  # reasons shown with several examples


def add_example(examples: dict[str, str], reason: str, example: str) -> None:
    """One example per reason, except bad values and lines: up to MAX_EXAMPLES, so a user sees the pattern."""
    if reason not in examples:
        examples[reason] = example
    elif reason in _SEVERAL and examples[reason].count(" | ") < MAX_EXAMPLES - 1 and example not in examples[reason]:
        examples[reason] += " | " + example


def merge_examples(into: dict[str, str], other: dict[str, str]) -> None:
    for reason, text in other.items():
        for example in text.split(" | ") if reason in _SEVERAL else [text]:
            add_example(into, reason, example)


def _bad_mask(values: pa.Array, convert: Callable[[pa.Array], object]) -> pa.Array | None:
    """Where ``convert`` fails value by value, or None when the whole column converts.

    Halves that convert are done with in one call; only failing halves are split further, so k bad
    values cost about k*log(n) whole-slice conversions instead of a per-row loop. Callers first rule
    out, with one vectorized pattern match, the values that cannot be what they want, so only the rare
    value that looks right and still fails (a 13th month, an integer too large) is searched for here.
    """
    bad: list[int] = []

    def search(low: int, high: int) -> None:
        try:
            convert(values.slice(low, high - low))
        except pa.ArrowInvalid:
            if high - low == 1:
                bad.append(low)
            else:
                middle = (low + high) // 2
                search(low, middle)
                search(middle, high)

    if len(values) == 0:
        return None
    search(0, len(values))
    if not bad:
        return None
    mask = np.zeros(len(values), dtype=bool)
    mask[bad] = True
    return pa.array(mask)


def _cast_rest(values: pa.Array, known: pa.Array | None, convert: Callable[[pa.Array], pa.Array]) -> tuple[pa.Array, pa.Array | None]:
    """``convert(values)`` with the values of ``known`` (already found bad) and those that fail nulled, and
    the mask of both (None: none)."""
    if known is not None and not pc.any(known).as_py():
        known = None
    rest = _without(values, known)
    try:
        return convert(rest), known
    except pa.ArrowInvalid:
        more = _bad_mask(rest, convert)
    bad = more if known is None else pc.or_(known, more)
    return convert(_without(values, bad)), bad


def _nulls(values: pa.Array | pa.ChunkedArray) -> pa.Array | None:
    """Where ``values`` are null; None when none is, which the checks skip (a column without nulls, the
    usual case, costs no mask a row). A dictionary's own null values count as nulls; other types whose
    nulls are not all in the validity bitmap (unions, run-end encoded) are always looked at."""
    for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        kind = chunk.type
        if chunk.null_count or pa.types.is_union(kind) or pa.types.is_run_end_encoded(kind) or (
                pa.types.is_dictionary(kind) and chunk.dictionary.null_count):
            return pc.is_null(values)
    return None


def _without(values: pa.Array, mask: pa.Array | None) -> pa.Array:
    return values if mask is None else pc.if_else(mask, pa.scalar(None, values.type), values)


def _not_numbers(values: pa.Array, integer: bool) -> pa.Array:
    """Where text cannot be a number: one character-class match over the column (cheaper than a number's
    full pattern), then the few values it rules out looked at again for inf and nan; a value of the right
    characters that is still no number (``1.2.3``) is left to the conversion's bisection."""
    shape = r"^[0-9+-]+$" if integer else r"^[0-9.eE+-]+$"
    bad = pc.and_kleene(pc.is_valid(values), pc.invert(pc.match_substring_regex(values, shape)))
    if not integer and pc.any(bad).as_py():
        special = pc.match_substring_regex(values.filter(bad), _SPECIAL_FLOAT, ignore_case=True)
        if pc.any(special).as_py():
            bad = pc.replace_with_mask(bad, bad, pc.invert(special))
    return bad


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_floating(kind) or pa.types.is_integer(kind) or pa.types.is_decimal(kind)


def _plain_text(values: pa.Array) -> pa.Array:
    return values.dictionary_decode() if pa.types.is_dictionary(values.type) else values


def _grouped_by(thousands: str, decimal: str) -> str:
    """A number grouped in threes by ``thousands``, with an optional fraction after ``decimal``."""
    sep, mark = re.escape(thousands), re.escape(decimal)
    return rf"^\s*[+-]?\d{{1,3}}({sep}\d{{3}})+({mark}\d*)?([eE][+-]?\d+)?\s*$"


def _naive_message(where: str, example: str | None = None) -> str:
    such_as = f" such as {example}" if example is not None else ""
    return f"{where} holds naive timestamps{such_as}: pass tz=... (--tz) to say which local time zone they are in"


def _to_us(values: pa.Array) -> pa.Array:
    """Microseconds, flooring nanoseconds so that no instant moves later and pre-1970 values round alike."""
    if values.type.unit == "ns":
        values = pc.floor_temporal(values, unit="microsecond")
    return values.cast(pa.timestamp("us", values.type.tz))


def timestamp_hint(value: str) -> str | None:
    """The ``--timestamp-format`` that reads ``value``, when it is written in a pattern historians and
    spreadsheets use; a day and month that could swap are named both ways."""
    text = " ".join(value.split())
    for fmt in TIMESTAMP_FORMATS:
        try:
            datetime.strptime(text, fmt)
        except ValueError:
            continue
        swapped = fmt.replace("%m/%d", "%d/%m") if "%m/%d" in fmt else None
        if swapped:
            try:
                datetime.strptime(text, swapped)
            except ValueError:
                swapped = None
        other = f" (or '{swapped}' if the day comes first)" if swapped else ""
        return f"--timestamp-format '{fmt}' reads it{other}"
    return None


def number_hint(value: str, decimal: str, thousands: str | None) -> str | None:
    """The ``--thousands``/``--decimal`` that read ``value``, a number written with other separators."""
    text = value.strip()
    marks = [ch for ch in text if ch in ",. '\u00a0\u202f"]
    if not marks:
        return None
    last = marks[-1]
    grouped = {m for m in marks[:-1]}
    flags: dict[str, str] = {}
    if len(set(marks)) == 1 and (len(marks) > 1 or re.fullmatch(r"[+-]?\d{1,3}[,.]\d{3}", text) and last != decimal):
        flags["thousands"] = last  # 1,234,567 or 1,234: grouping only
    elif last in ",." and not (len(marks) > 1 and grouped == {last}):
        flags["decimal"] = last
        if grouped - {last}:
            flags["thousands"] = next(iter(grouped - {last}))
    elif last not in ",.":
        flags["thousands"] = last
    if flags.get("thousands") == decimal and "decimal" not in flags:  # 12.345.678 where '.' is the decimal mark
        flags["decimal"] = "," if decimal == "." else "."
    options = []
    if flags.get("thousands") and flags["thousands"] != thousands:
        options.append(f"--thousands {_quoted(flags['thousands'])}")
    if flags.get("decimal") and flags["decimal"] != decimal:
        options.append(f"--decimal {_quoted(flags['decimal'])}")
    return f"{' '.join(options)} reads it" if options else None


def _quoted(mark: str) -> str:
    return '"\'"' if mark == "'" else f"'{mark}'"


#: strptime formats of exported timestamps, tried in order to suggest one (`timestamp_hint`); each one
#: Arrow's strptime reads too
TIMESTAMP_FORMATS = (
    "%m/%d/%Y %I:%M:%S %p", "%m/%d/%Y %I:%M %p", "%d/%m/%Y %I:%M:%S %p",
    "%m/%d/%Y %H:%M:%S", "%d/%m/%Y %H:%M:%S", "%m/%d/%Y %H:%M", "%d/%m/%Y %H:%M",
    "%m/%d/%y %I:%M:%S %p", "%m/%d/%y %H:%M:%S",
    "%d-%b-%y %H:%M:%S", "%d-%b-%Y %H:%M:%S", "%d-%b-%y %I:%M:%S %p", "%d-%b-%Y %I:%M:%S %p",
    "%Y/%m/%d %H:%M:%S", "%Y/%m/%d %H:%M", "%Y-%m-%d %I:%M:%S %p", "%d.%m.%Y %I:%M:%S %p",
    "%d.%m.%y %H:%M:%S", "%d.%m.%y %H:%M", "%Y%m%d %H%M%S", "%Y%m%dT%H%M%S", "%Y%m%d%H%M%S",
    "%m/%d/%Y", "%d-%b-%Y", "%Y/%m/%d",
)
