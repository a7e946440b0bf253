"""Mapping raw source batches onto the target table schema.

Everything that can be checked from schemas alone is checked when the mapper
is built, so that a wrong column map or a missing time zone fails before hours
of data are read. What can only be seen in the data (unparseable values, nulls,
local times that do not exist or occur twice) is handled per batch: bad values
stop the job with the file, row and value named, while rows that merely cannot
be placed are dropped and counted so the caller can decide how strict to be.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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

_T = TypeVar("_T")
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


class MappingError(ValueError):
    """The source cannot be mapped; names table and source column, type, and for bad values the file, row and value."""


@dataclass
class MappedBatch:
    """Rows ready to append (exactly the target schema) plus a tally of rows left out, with one example per reason."""

    table: pa.Table
    rejected: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)


class Mapper:
    """Turns source batches into target-schema tables with a UTC microsecond time column.

    Each dropped row is counted once, under the first reason that applies, in
    the order null_time, dst_nonexistent, dst_ambiguous, null_series_key,
    null_required. Columns are looked up by name in every batch rather than by
    position, so pieces whose schemas differ slightly (column order, a sparse
    JSON field) still map; ``filled_with_null`` lists the nullable table
    columns absent from the schema the mapper was built with.
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
        timestamp_format: str | None = None,
        keep_dictionary: tuple[str, ...] = (),
    ) -> None:
        """``keep_dictionary``: table columns that stay dictionary-encoded when the source gives them so
        (their values are cast, not each row), for a caller that would encode them again."""
        self.target = target
        self.keep_dictionary = set(keep_dictionary)
        self.time_column = time_column
        self.series_key = list(series_key)
        self.tz = tz
        self.time_unit = time_unit
        self.dst_policy = dst_policy
        self.on_bad_value = on_bad_value
        self.decimal = decimal
        self.timestamp_format = timestamp_format
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
        """Map one batch; raises MappingError on the first value that cannot be converted."""
        where = _locator(batch)
        raw = {f.name: self._prepared(batch, f) for f in self.target}
        bad: dict[str, pa.Array] = {}
        if self.on_bad_value != "fail":
            for f in self.target:
                convert = (lambda v: self._to_utc(v, where)) if f.name == self.time_column else (
                    lambda v, t=f.type: pc.cast(v, t, safe=True))
                if (mask := _bad_mask(raw[f.name], convert)) is not None:
                    bad[f.name] = mask
        raw_time = raw[self.time_column]
        time_values = _without(raw_time, bad.get(self.time_column))
        when, nonexistent, ambiguous = self._convert(
            self.time_column, time_values, _UTC_US, lambda v: self._to_utc(v, where), where
        )
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
            *(("bad_value", n, mask) for n, mask in bad.items() if rejecting),
            ("null_time", self.time_column, pc.is_null(when)),
            ("dst_nonexistent", self.time_column, nonexistent),
            ("dst_ambiguous", self.time_column, ambiguous),
            ("dst_collapsed", self.time_column, collapsed),
            *(("null_series_key", n, pc.is_null(self._column(batch, n))) for n in self.series_key),
            *(("null_required", n, pc.is_null(self._column(batch, n))) for n in self._required),
        ]
        rejected: Counter[str] = Counter()
        examples: dict[str, str] = {}
        dropped: pa.Array | None = None
        for reason, name, mask in checks:
            if mask is None:
                continue
            mask = pc.fill_null(mask, False)
            if dropped is not None:
                mask = pc.and_(mask, pc.invert(dropped))
            if count := pc.sum(mask).as_py():
                rejected[reason] += count
                for i in pc.indices_nonzero(mask)[: MAX_EXAMPLES if reason == "bad_value" else 1].to_pylist():
                    value = raw[name][i].as_py()
                    value = "null" if value is None else value
                    add_example(examples, reason, f"{_row(batch, i)}: {self.source_of[name]}={value}")
            dropped = mask if dropped is None else pc.or_(dropped, mask)
        keep = pc.invert(dropped) if rejected else None
        where = _locator(batch, keep)
        arrays, fields = [], []
        for f in self.target:
            values = when if f.name == self.time_column else _without(raw[f.name], bad.get(f.name))
            values = values if keep is None else values.filter(keep)
            if f.name in self.keep_dictionary and pa.types.is_dictionary(values.type):
                cast = lambda v, t=f.type: pa.DictionaryArray.from_arrays(v.indices, pc.cast(v.dictionary, t, safe=True))  # noqa: E731
            else:
                cast = lambda v, t=f.type: pc.cast(v, t, safe=True)  # noqa: E731
            arrays.append(self._convert(f.name, values, f.type, cast, where))
            fields.append(f.with_type(arrays[-1].type))
        return MappedBatch(pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=self.target.metadata)),
                           rejected, examples)

    def utc_bounds(self, source_type: pa.DataType, low: int, high: int) -> tuple[int, int] | None:
        """UTC microseconds of the least and greatest source time value (a file's footer statistics, the
        integers stored), when the time column's conversion keeps order exactly (an absolute timestamp,
        an epoch integer), so every row of the file maps inside them; None for text and local times (a
        DST fold may reorder them)."""
        absolute = pa.types.is_timestamp(source_type) and source_type.tz is not None
        if not (absolute or (pa.types.is_integer(source_type) and self.time_unit)):
            return None
        stored = pa.array([low, high], pa.int64()).cast(source_type)
        when, _, _ = self._to_utc(stored, lambda i: "the footer statistics")
        low_us, high_us = pc.cast(when, pa.int64()).to_pylist()
        return (low_us, high_us) if low_us is not None and high_us is not None else None

    def undetermined(self) -> list[str]:
        """Series and hours where "infer" could not tell the passes apart: a single pass through the
        repeated hour, or a series not in time order there. Complete once every batch is mapped."""
        for (piece, key, _day), (_first, second) in self._folds.items():
            if second is None:
                self._undetermined.setdefault((piece, key, _day), self._fold_name(piece, key, _first))
        return list(self._undetermined.values())

    def _fold_name(self, piece: str, key: tuple, local_us: int) -> str:
        series = ", ".join(f"{n}={v}" for n, v in zip(self.series_key, key, strict=True))
        hour = pa.scalar(local_us - local_us % 3_600_000_000, pa.timestamp("us")).as_py()
        return f"series {series} at {hour:%Y-%m-%d %H:%M} local in {piece}"

    def _ambiguous_rows(self, batch: SourceBatch, when: pa.Array, ambiguous: pa.Array) -> tuple:
        """Positions, local wall-clock microseconds and series keys of the ambiguous rows, in source order."""
        at = pc.indices_nonzero(ambiguous)
        local = pc.local_timestamp(when.take(at).cast(pa.timestamp("us", self.tz))).cast(pa.int64()).to_pylist()
        keys = list(zip(*(self._column(batch, n).take(at).to_pylist() for n in self.series_key), strict=True))
        return at.to_numpy(), local, keys if self.series_key else [()] * len(local)

    def _infer(self, batch: SourceBatch, when: pa.Array, ambiguous: pa.Array) -> pa.Array:
        """The later instant for rows after the wall clock went back within a series' repeated hour."""
        at, local, keys = self._ambiguous_rows(batch, when, ambiguous)
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
        at, local, keys = self._ambiguous_rows(batch, when, ambiguous)
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
        """The source column, with a decimal comma turned into a point where the table wants numbers."""
        values = self._column(batch, target.name)
        text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
        numeric = pa.types.is_floating(target.type) or pa.types.is_decimal(target.type)
        if text and numeric and self.decimal != ".":
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

    def _convert(
        self, name: str, values: pa.Array, to: pa.DataType, convert: Callable[[pa.Array], _T], where: _Where
    ) -> _T:
        """Convert a whole column, and only on failure search for the value to blame.

        Conversions work value by value, so bisection finds the first bad
        value with a logarithmic number of whole-slice conversions instead of
        a per-row loop.
        """
        try:
            return convert(values)
        except pa.ArrowNotImplementedError as e:
            column = f"column '{name}' (source '{self.source_of[name]}')"
            raise MappingError(f"{column} cannot be converted from {values.type} to {to}") from e
        except pa.ArrowInvalid as e:
            error: Exception = e
            low, high = 0, len(values)
            while high - low > 1:
                middle = (low + high) // 2
                try:
                    convert(values.slice(low, middle - low))
                    low = middle
                except pa.ArrowInvalid:
                    high = middle
            try:
                convert(values.slice(low, 1))
            except pa.ArrowInvalid as single:
                error = single
            text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
            reason = "not an ISO 8601 date and time" if text and pa.types.is_timestamp(to) else error
            raise MappingError(
                f"column '{name}' (source '{self.source_of[name]}'): cannot convert {values[low].as_py()!r} "
                f"at {where(low)} to {to}: {reason} (--on-bad-value null or reject loads the rest)"
            ) from e

    def _to_utc(self, values: pa.Array, where: _Where) -> _Instants:
        """Dispatch on the type of each batch, not the construction-time schema: pieces may differ."""
        self._check_type(self.time_column, values.type)
        kind = values.type
        if pa.types.is_dictionary(kind):
            values, kind = values.dictionary_decode(), kind.value_type
        if pa.types.is_null(kind):
            return pa.nulls(len(values), _UTC_US), None, None
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return self._parse(values, where)
        if pa.types.is_integer(kind):
            return _to_us(values.cast(pa.int64()).cast(pa.timestamp(self.time_unit, "UTC"))), None, None
        if pa.types.is_timestamp(kind) and kind.tz is not None:
            return _to_us(values.cast(pa.timestamp(kind.unit, "UTC"))), None, None
        if pa.types.is_date(kind):
            values = values.cast(pa.timestamp("us"))
        return self._localize(_to_us(values))

    def _parse(self, text: pa.Array, where: _Where) -> _Instants:
        """ISO 8601 per value: an offset makes a value absolute, otherwise it is local time in ``tz``.

        Fraction digits beyond microseconds are cut off in the text, which
        floors the instant and keeps the full microsecond date range (parsing
        as nanoseconds would limit it to 1677-2262). Naive values without a
        zone are refused before any parsing, so that the error names them
        rather than a parse failure elsewhere.
        """
        text = pc.utf8_trim_whitespace(text)
        if self.timestamp_format is not None:
            return self._strptime(text, where)
        text = pc.replace_substring_regex(text, _DOTTED, r"\3-\2-\1\4")
        text = pc.replace_substring_regex(text, r"(\.\d{6})\d+", r"\1")
        absolute = pc.fill_null(pc.match_substring_regex(text, _OFFSET), False)
        nothing = pa.scalar(None, text.type)
        local = pc.if_else(absolute, nothing, text)
        if self.tz is None and local.null_count < len(local):
            # a value that is no time at all says so (column, file, value), not that it needs a zone
            self._convert(self.time_column, local, _UTC_US, lambda v: v.cast(pa.timestamp("us")), where)
            i = pc.index(pc.is_valid(local), True).as_py()
            column = f"column '{self.time_column}' (source '{self.source_of[self.time_column]}')"
            raise MappingError(_naive_message(column, f"{local[i].as_py()!r} at {where(i)}"))
        aware = pc.if_else(absolute, text, nothing).cast(_UTC_US)
        if local.null_count == len(local):
            return aware, None, None
        when, nonexistent, ambiguous = self._localize(local.cast(pa.timestamp("us")))
        return pc.coalesce(aware, when), nonexistent, ambiguous

    def _strptime(self, text: pa.Array, where: _Where) -> _Instants:
        """Text in the job's strptime format; with %z it is absolute, otherwise local time in ``tz``."""
        try:
            parsed = pc.strptime(text, format=self.timestamp_format, unit="us", error_is_null=False)
        except pa.ArrowInvalid as e:
            raise pa.ArrowInvalid(f"does not match timestamp_format {self.timestamp_format!r}") from e
        if parsed.type.tz is not None:
            return parsed.cast(_UTC_US), None, None
        if self.tz is None and parsed.null_count < len(parsed):
            i = pc.index(pc.is_valid(parsed), True).as_py()
            column = f"column '{self.time_column}' (source '{self.source_of[self.time_column]}')"
            raise MappingError(_naive_message(column, f"{text[i].as_py()!r} at {where(i)}"))
        return self._localize(parsed)

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
    values cost about k*log(n) whole-slice conversions instead of a per-row loop.
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


def _without(values: pa.Array, mask: pa.Array | None) -> pa.Array:
    return values if mask is None else pc.if_else(mask, pa.scalar(None, values.type), values)


def _naive_message(where: str, example: str | None = None) -> str:
    such_as = f" such as {example}" if example is not None else ""
    return f"{where} holds naive timestamps{such_as}: pass tz=... (--tz) to say which local time zone they are in"


def _to_us(values: pa.Array) -> pa.Array:
    """Microseconds, flooring nanoseconds so that no instant moves later and pre-1970 values round alike."""
    if values.type.unit == "ns":
        values = pc.floor_temporal(values, unit="microsecond")
    return values.cast(pa.timestamp("us", values.type.tz))


def _row(batch: SourceBatch, index: int) -> str:
    return f"row {batch.row_offset + index} of {batch.origin}"


def _locator(batch: SourceBatch, keep: pa.Array | None = None) -> _Where:
    """Names the source row behind a position; after filtering, positions count only the kept rows."""

    def where(index: int) -> str:
        return _row(batch, index if keep is None else pc.indices_nonzero(keep)[index].as_py())

    return where
