"""InfluxDB line protocol: export files parsed into Arrow a chunk of whole lines at a time.

Splitting on spaces, commas and equal signs is done with Arrow compute kernels over the whole
chunk; quoted strings are first masked so those separators inside them do not split, and only
lines with backslash escapes go through a per-line tokenizer. Types come from each value's
spelling (``1i``, ``1u``, ``t``, ``"…"``, else float), and a field spelled two ways is an error that
names both lines. Exports write one line per field of a point, so the lines of a point are merged
into one row (``points``) before the rows leave this module.
"""

from __future__ import annotations

import re
import tempfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from timelake.sources.base import SourceError, _line_chunks

if TYPE_CHECKING:
    import duckdb

TIME = "time"
LINE = "__line"
_DUCK = {pa.int64(): "BIGINT", pa.uint64(): "UBIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
         pa.bool_(): "BOOLEAN"}
_MERGE_MEMORY = "512MB"
TIME_TYPE = pa.timestamp("ns", tz="UTC")
_NS_PER = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_CHUNK_BYTES = 8 << 20
_AHEAD = 2  # chunks split ahead of the one being typed
_TRUE = ["t", "T", "true", "True", "TRUE"]
_FALSE = ["f", "F", "false", "False", "FALSE"]
ARROW_TYPES = {"float": pa.float64(), "integer": pa.int64(), "unsigned": pa.uint64(), "string": pa.string(),
               "boolean": pa.bool_()}
_KINDS = ["float", "string", "integer", "unsigned", "boolean"]  # by the code _kind gives each spelling
_DDL = ("CREATE DATABASE ", "CREATE RETENTION POLICY ")  # the DDL part of an export
_KEY = r"(?:[^,=\s\\]|\\.)+"
_MASK = {" ": "\x01", ",": "\x02", "=": "\x03"}
_MASK_BYTES = np.frombuffer(bytes.maketrans("".join(_MASK).encode(), "".join(_MASK.values()).encode()), np.uint8)
_SEPARATOR = _MASK_BYTES != np.arange(256)
_UNMASK = str.maketrans({code: char for char, code in _MASK.items()})
_SLOW_LINE = re.compile(
    rf"(?P<m>(?:[^,\s\\]|\\.)+)(?P<tags>(?:,{_KEY}=(?:[^,=\s\\]|\\.)*)*)"
    rf" (?P<fields>{_KEY}=(?:\"(?:[^\"\\]|\\.)*\"|[^,\s\"]+)(?:,{_KEY}=(?:\"(?:[^\"\\]|\\.)*\"|[^,\s\"]+))*)"
    r"(?: (?P<ts>-?\d+))?\Z"
)
_SLOW_PAIR = re.compile(rf"({_KEY})=(\"(?:[^\"\\]|\\.)*\"|(?:[^,\s\\]|\\.)*)")
_UNESCAPE = re.compile(r"\\([,= \"\\])")


class InfluxError(SourceError):
    """Line protocol that cannot be read, or a field whose type changes between points."""


@dataclass
class _Parsed:
    """One chunk's points as (row, key, raw text) triples, before columns are built."""

    lines: np.ndarray  # file line number of each row
    measurement: pa.Array
    time: pa.Array
    tag_rows: pa.Array
    tag_keys: pa.Array
    tag_values: pa.Array
    field_rows: pa.Array
    field_keys: pa.Array
    field_values: pa.Array


@dataclass
class _Named:
    """One chunk's points as columns, when every line names the same tags and fields in the same places."""

    lines: np.ndarray
    measurement: pa.Array
    time: pa.Array
    tags: dict[str, pa.Array]
    fields: dict[str, pa.Array]


class LineProtocol:
    """Parses chunks of one stream; remembers field kinds so a type change across chunks is caught too."""

    def __init__(self, measurement: str, precision: str, origin: str) -> None:
        self.measurement = measurement
        self.precision = precision
        self.origin = origin
        self.kinds: dict[str, tuple[str, int]] = {}
        self.tags: set[str] = set()
        self.seen: set[str] = set()

    def batches(self, stream: pa.NativeFile) -> Iterator[pa.RecordBatch]:
        """The points of the measurement, one row per line (with its line number in LINE)."""
        for parts in self._split(stream):
            batch = self._columns(*parts)
            if batch.num_rows:
                yield batch

    def scan(self, stream: pa.NativeFile) -> pa.Schema:
        """Tags and typed fields of the whole stream, without building columns; raises on a field's second type."""
        for parts in self._split(stream):
            for part in parts:
                wanted = self._wanted(part.measurement)
                if isinstance(part, _Named):
                    if not wanted.any():
                        continue
                    self.tags.update(part.tags)
                    for key, raw in part.fields.items():
                        self._kind(key, raw.filter(pa.array(wanted)), part.lines[wanted])
                    continue
                tag_mine = pa.array(wanted[np.asarray(part.tag_rows, dtype=np.int64)])
                self.tags.update(key for key, _ in _groups(part.tag_keys.filter(tag_mine)))
                rows = np.asarray(part.field_rows, dtype=np.int64)
                mine = pa.array(wanted[rows])
                keys, values, lines = part.field_keys.filter(mine), part.field_values.filter(mine), part.lines[rows[wanted[rows]]]
                for key, pick in _groups(keys):
                    self._kind(key, values.filter(pa.array(pick)), lines[pick])
        return self.schema()

    def _wanted(self, measurement: pa.Array) -> np.ndarray:
        """Rows of the job's measurement; notes the others, to name them if it is missing."""
        groups = _groups(measurement)
        self.seen.update(key for key, _ in groups)
        return next((pick for key, pick in groups if key == self.measurement), np.zeros(len(measurement), dtype=bool))

    def schema(self) -> pa.Schema:
        return pa.schema([(TIME, TIME_TYPE), *((t, pa.string()) for t in sorted(self.tags)),
                          *((f, ARROW_TYPES[k]) for f, (k, _) in sorted(self.kinds.items()))])

    def _split(self, stream: pa.NativeFile) -> Iterator[tuple[_Parsed | _Named, ...]]:
        """Chunks split into triples on threads (Arrow kernels release the GIL), in file order.

        Only splitting runs ahead, at most _AHEAD chunks: typing the fields stays in order, so the
        first line of each type, named when a type changes, is the first in the file.
        """
        with ThreadPoolExecutor(max_workers=_AHEAD, thread_name_prefix="line-protocol") as pool:
            pending: deque[Future] = deque()
            line = 1
            for chunk in _line_chunks(stream, _CHUNK_BYTES):
                pending.append(pool.submit(self._parts, chunk, line))
                line += chunk.count(b"\n") + (not chunk.endswith(b"\n"))
                if len(pending) > _AHEAD:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def _parts(self, chunk: bytes, first_line: int) -> tuple[_Parsed, _Parsed] | tuple[_Parsed | _Named]:
        plain = _plain(chunk, first_line)
        if plain is not None:
            return (plain,)
        lines = pc.list_flatten(pc.split_pattern(pa.array([chunk], pa.binary()), b"\n"))
        try:
            lines = pc.utf8_trim(lines.cast(pa.string()), "\r")
        except pa.ArrowInvalid as e:
            raise InfluxError(f"{self.origin} near line {first_line} is not UTF-8 text: {e}") from e
        numbers = np.arange(first_line, first_line + len(lines))
        skip = pc.or_(pc.starts_with(lines, "#"), pc.or_(*(pc.starts_with(lines, ddl) for ddl in _DDL)))
        keep = pc.and_(pc.not_equal(lines, ""), pc.invert(skip))
        lines, numbers = lines.filter(keep), numbers[_mask(keep)]
        tricky = np.zeros(len(lines), dtype=bool)  # whole-chunk tests first: most chunks need no per-line test
        if b'"' in chunk:
            tricky |= _mask(pc.equal(pc.bit_wise_and(pc.count_substring(lines, '"'), 1), 1))
        if b"\\" in chunk:
            tricky |= _mask(pc.match_substring(lines, "\\"))
        if any(code.encode() in chunk for code in _MASK.values()):
            tricky |= _mask(pc.match_substring_regex(lines, "[\x01-\x03]"))
        simple = lines.filter(pa.array(~tricky))
        fast = self._fast(_mask_quoted(simple) if b'"' in chunk else simple, numbers[~tricky])
        slow = self._slow(lines.filter(pa.array(tricky)), numbers[tricky])
        return fast, slow

    def _fast(self, lines: pa.Array, numbers: np.ndarray) -> _Parsed:
        parts = pc.split_pattern(lines, " ", max_splits=2)
        counts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((counts < 2) | (counts > 3))
        if len(bad):
            self._malformed(numbers[bad[0]], lines[int(bad[0])].as_py())
        series = pc.split_pattern(pc.list_element(parts, 0), ",")
        measurement = pc.list_element(series, 0)
        tags = pc.list_slice(series, 1)
        fields = pc.split_pattern(pc.list_element(parts, 1), ",")
        last = pc.list_slice(parts, 2, 3)
        stamps = _scatter(np.asarray(pc.list_parent_indices(last)), pc.list_flatten(last), len(lines))
        tag_rows, tag_keys, tag_values = self._pairs(tags, numbers, lines)
        field_rows, field_keys, field_values = self._pairs(fields, numbers, lines)
        return _Parsed(numbers, measurement, stamps, tag_rows, tag_keys, _unmask(tag_values), field_rows, field_keys,
                       field_values)

    def _pairs(self, lists: pa.Array, numbers: np.ndarray, lines: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
        rows = pc.list_parent_indices(lists)
        pairs = pc.split_pattern(pc.list_flatten(lists), "=", max_splits=1)
        bad = np.flatnonzero(pc.list_value_length(pairs).to_numpy(zero_copy_only=False) != 2)
        if len(bad):
            row = int(rows[int(bad[0])].as_py())
            self._malformed(numbers[row], lines[row].as_py())
        return rows, pc.list_element(pairs, 0), pc.list_element(pairs, 1)

    def _slow(self, lines: pa.Array, numbers: np.ndarray) -> _Parsed:
        measurements, stamps, tags, fields = [], [], ([], [], []), ([], [], [])
        for row, text in enumerate(lines.to_pylist()):
            match = _SLOW_LINE.match(text)
            if match is None:
                self._malformed(numbers[row], text)
            measurements.append(_UNESCAPE.sub(r"\1", match["m"]))
            stamps.append(match["ts"])
            for (rows, keys, values), text_part, unquote in ((tags, match["tags"], True), (fields, match["fields"], False)):
                for key, value in _SLOW_PAIR.findall(text_part):
                    rows.append(row)
                    keys.append(_UNESCAPE.sub(r"\1", key))
                    values.append(_UNESCAPE.sub(r"\1", value) if unquote else value)
        as_arrays = [pa.array(tags[0], pa.int64()), pa.array(tags[1], pa.string()), pa.array(tags[2], pa.string()),
                     pa.array(fields[0], pa.int64()), pa.array(fields[1], pa.string()), pa.array(fields[2], pa.string())]
        return _Parsed(numbers, pa.array(measurements, pa.string()), pa.array(stamps, pa.string()), *as_arrays)

    def _columns(self, *parts: _Parsed | _Named) -> pa.RecordBatch:
        """Rows of the wanted measurement, fast and slow lines together in file order."""
        if isinstance(parts[0], _Named):
            return self._named(parts[0])
        numbers = np.concatenate([p.lines for p in parts])
        measurement = pa.concat_arrays([p.measurement for p in parts])
        offsets = np.cumsum([0, *(len(p.lines) for p in parts)])
        wanted = self._wanted(measurement)
        order = np.argsort(numbers[wanted], kind="stable")
        position = np.full(len(numbers), -1, dtype=np.int64)
        position[np.flatnonzero(wanted)[order]] = np.arange(int(wanted.sum()))
        lines = numbers[wanted][order]
        stamps = pa.concat_arrays([p.time for p in parts]).take(pa.array(np.flatnonzero(wanted)[order]))
        columns: dict[str, pa.Array] = {TIME: self._time(stamps, lines), LINE: pa.array(lines, pa.int64())}

        def triples(kind: str) -> tuple[np.ndarray, pa.Array, pa.Array]:
            rows = np.concatenate([np.asarray(getattr(p, f"{kind}_rows"), dtype=np.int64) + off
                                   for p, off in zip(parts, offsets, strict=False)])
            keys = pa.concat_arrays([getattr(p, f"{kind}_keys") for p in parts])
            values = pa.concat_arrays([getattr(p, f"{kind}_values") for p in parts])
            at = position[rows] if len(rows) else rows
            mine = at >= 0
            return at[mine], keys.filter(pa.array(mine)), values.filter(pa.array(mine))

        at, keys, values = triples("tag")
        for key, pick in _groups(keys):
            self.tags.add(key)
            columns[key] = _scatter(at[pick], values.filter(pa.array(pick)), len(lines))
        at, keys, values = triples("field")
        for key, pick in _groups(keys):
            if key in columns:
                raise InfluxError(f"{self.origin}: '{key}' of measurement '{self.measurement}' is both a tag and a field")
            raw = values.filter(pa.array(pick))
            typed = self._typed(key, self._kind(key, raw, lines[at[pick]]), raw)
            columns[key] = _scatter(at[pick], typed, len(lines))
        return pa.RecordBatch.from_pydict(columns)

    def _named(self, part: _Named) -> pa.RecordBatch:
        """A chunk whose every line has the same keys: its columns are already the table's columns."""
        wanted = self._wanted(part.measurement)
        if not wanted.any():
            return pa.record_batch({TIME: pa.array([], TIME_TYPE)})
        lines, pick = part.lines[wanted], pa.array(wanted)
        columns = {TIME: self._time(part.time.filter(pick), lines), LINE: pa.array(lines, pa.int64())}
        for key in sorted(part.tags):
            self.tags.add(key)
            columns[key] = part.tags[key].filter(pick)
        for key in sorted(part.fields):
            if key in columns:
                raise InfluxError(f"{self.origin}: '{key}' of measurement '{self.measurement}' is both a tag and a field")
            raw = part.fields[key].filter(pick)
            columns[key] = self._typed(key, self._kind(key, raw, lines), raw)
        return pa.RecordBatch.from_pydict(columns)

    def _time(self, stamps: pa.Array, lines: np.ndarray) -> pa.Array:
        missing = np.flatnonzero(_mask(stamps.is_null()))
        if len(missing):
            raise InfluxError(f"line {lines[missing[0]]} of {self.origin} has no timestamp (an export always has one)")
        try:
            ns = pc.multiply_checked(stamps.cast(pa.int64()), _NS_PER[self.precision])
        except pa.ArrowInvalid as e:
            raise InfluxError(f"{self.origin}: a timestamp is not an integer number of {self.precision}: {e}") from e
        return ns.cast(TIME_TYPE)

    def _kind(self, key: str, raw: pa.Array, lines: np.ndarray) -> str:
        """The field's type by the protocol spelling of its values; every point must spell the same type."""
        spelled = [_mask(m) for m in (pc.starts_with(raw, '"'), pc.ends_with(raw, "i"), pc.ends_with(raw, "u"),
                                      pc.is_in(raw, pa.array(_TRUE + _FALSE)))]
        codes = np.select(spelled, [1, 2, 3, 4], 0).astype(np.int8)  # integer codes: a unique of strings is slow
        firsts = sorted(int(np.argmax(codes == code)) for code in np.flatnonzero(np.bincount(codes, minlength=5)))
        for first in firsts:  # in file order: the message names the type seen first, then the other
            kind = _KINDS[codes[first]]
            known = self.kinds.setdefault(key, (kind, int(lines[first])))
            if known[0] != kind:
                raise InfluxError(
                    f"field '{key}' of measurement '{self.measurement}' has two types in {self.origin}: "
                    f"{known[0]} at line {known[1]} and {kind} at line {lines[first]}"
                )
        return self.kinds[key][0]

    def _typed(self, key: str, kind: str, raw: pa.Array) -> pa.Array:
        if kind == "string":
            inner = _unmask(pc.utf8_slice_codeunits(raw, 1, -1))
            return pc.replace_substring(pc.replace_substring(inner, '\\"', '"'), "\\\\", "\\")
        if kind == "boolean":
            return pc.is_in(raw, pa.array(_TRUE))
        if kind in ("integer", "unsigned"):
            raw = pc.utf8_slice_codeunits(raw, 0, -1)
        try:
            return raw.cast(ARROW_TYPES[kind])
        except pa.ArrowInvalid as e:
            raise InfluxError(f"field '{key}' of measurement '{self.measurement}' in {self.origin} "
                              f"has a value that is not a {kind}: {e}") from e

    def _malformed(self, line: int, text: str) -> None:
        raise InfluxError(f"line {line} of {self.origin} is not line protocol: {text.translate(_UNMASK)[:80]!r}")


_BOUNDARY = "\x01"
_PLAIN_OPTIONS = (pcsv.ReadOptions(autogenerate_column_names=True, block_size=_CHUNK_BYTES * 4, use_threads=False),
                  pcsv.ParseOptions(quote_char=False, escape_char=False, double_quote=False, newlines_in_values=False,
                                    ignore_empty_lines=False))
_NOT_PLAIN = (b"\\", b"\r", _BOUNDARY.encode(), *(c.encode() for c in _MASK.values()))  # one byte each: memchr


def _plain(chunk: bytes, first_line: int) -> _Parsed | _Named | None:
    """A chunk of lines of one shape, split by Arrow's CSV reader in one pass; None if it is not that simple.

    Lines without escapes or comments that all have the same number of tags, fields and
    separators (the usual export: one series layout, one field per line) become rows of a CSV once
    spaces are marked and equal signs are commas. Every separator is counted over the whole chunk,
    so a line the reader would split differently from the line protocol sends the chunk to the
    general path, which also names the bad line.
    """
    if any(mark in chunk for mark in _NOT_PLAIN):
        return None
    if b'"' in chunk:  # separators inside quotes masked; without backslashes the quotes of a line pair up
        text = np.frombuffer(chunk, np.uint8).copy()
        quotes = np.flatnonzero(text == ord('"'))
        ends = np.flatnonzero(text == ord("\n"))
        if len(quotes) % 2 or (np.searchsorted(ends, quotes[0::2]) != np.searchsorted(ends, quotes[1::2])).any():
            return None  # a line with an odd number of quotes
        separators = np.flatnonzero(_SEPARATOR[text])
        masked = separators[np.searchsorted(quotes, separators) % 2 == 1]  # after an odd number of quotes
        text[masked] = _MASK_BYTES[text[masked]]
        chunk = text.tobytes()
    text = chunk.replace(b" ", b",\x01,").replace(b"=", b",")
    try:
        table = pcsv.read_csv(pa.BufferReader(text), *_PLAIN_OPTIONS,
                              convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(
                                  (f"f{i}" for i in range(text.split(b"\n", 1)[0].count(b",") + 1)), pa.string())))
    except pa.ArrowInvalid:  # lines of several shapes (an empty line is one too), or not UTF-8
        return None
    skipped = pc.or_(pc.starts_with(table.column(0), "#"), pc.equal(table.column(0), "CREATE"))
    if pc.any(skipped).as_py():  # comments and DDL, of a shape that passed for data
        return None
    rows, width = table.num_rows, table.num_columns
    boundaries = [i for i in range(width) if table.column(i)[0].as_py() == _BOUNDARY]
    pairs = (width - 1 - len(boundaries) - 1) // 2
    if (len(boundaries) != 2 or boundaries[1] != width - 2 or (boundaries[0] - 1) % 2
            or (width - boundaries[0] - 3) % 2 or pairs < 1 or chunk.count(b" ") != 2 * rows
            or chunk.count(b"=") != pairs * rows or chunk.count(b",") != (pairs - 1) * rows
            or any(table.column(i).null_count or pc.any(pc.not_equal(table.column(i), _BOUNDARY)).as_py()
                   for i in boundaries)):
        return None
    tags = range(1, boundaries[0], 2)
    fields = range(boundaries[0] + 1, width - 2, 2)
    if not len(fields):
        return None

    def column(*at: int) -> pa.Array:
        return pa.concat_arrays([chunk for i in at for chunk in table.column(i).chunks])

    numbers = np.arange(first_line, first_line + rows)
    names = [table.column(i)[0].as_py() for i in (*tags, *fields)]
    if len(set(names)) == len(names) and all(_same(table.column(i), name) for i, name in zip((*tags, *fields), names)):
        return _Named(numbers, column(0), column(width - 1), {names[n]: column(i + 1) for n, i in enumerate(tags)},
                      {names[len(tags) + n]: column(i + 1) for n, i in enumerate(fields)})

    def triples(starts: range) -> tuple[pa.Array, pa.Array, pa.Array]:
        at = pa.array(np.tile(np.arange(rows, dtype=np.int64), len(starts)))
        return at, column(*starts), column(*(i + 1 for i in starts))

    return _Parsed(numbers, column(0), column(width - 1), *triples(tags),
                   *triples(fields))


def _same(column: pa.ChunkedArray, value: str) -> bool:
    low_high = pc.min_max(column)
    return low_high["min"].as_py() == value == low_high["max"].as_py()


def _mask_quoted(lines: pa.Array) -> pa.Array:
    """Spaces, commas and equal signs inside double quotes swapped for control characters.

    Then splitting on them is right for lines with quoted strings too; this keeps string fields,
    common in real exports, off the per-line tokenizer. Lines are split at their quotes (which,
    without backslashes, pair up), every other part is masked, and the parts are joined again.
    """
    parts = pc.split_pattern(lines, '"')
    flat = pc.list_flatten(parts)
    starts = parts.offsets.to_numpy()[np.asarray(pc.list_parent_indices(parts))]
    inside = pa.array((np.arange(len(flat)) - starts) % 2 == 1)
    masked = flat
    for char, code in _MASK.items():
        masked = pc.replace_substring(masked, char, code)
    return pc.binary_join(pa.ListArray.from_arrays(parts.offsets, pc.if_else(inside, masked, flat)), '"')


def _unmask(values: pa.Array) -> pa.Array:
    for char, code in _MASK.items():
        values = pc.replace_substring(values, code, char)
    return values


def _mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)


def _groups(keys: pa.Array) -> list[tuple[str, np.ndarray]]:
    """Each distinct key with the mask of its positions: one hash pass, then integer compares."""
    encoded = keys.dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    return sorted((key, codes == code) for code, key in enumerate(encoded.dictionary.to_pylist()))


def _scatter(at: np.ndarray, values: pa.Array, rows: int) -> pa.Array:
    """A column of ``rows`` with ``values`` at positions ``at`` and nulls elsewhere (last write wins)."""
    index = np.full(rows, -1, dtype=np.int64)
    index[at] = np.arange(len(at))
    return values.take(pa.array(index, mask=index < 0))


def points(parser: LineProtocol, lines: Iterator[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Lines of one point (series and time) merged into one row, the later line winning per field.

    Exports write one line per field of a point (TSM files store fields apart), far apart in the
    file, so the merge cannot be done chunk by chunk: the lines go to a DuckDB table that spills
    to a temporary folder beyond _MERGE_MEMORY, and come back one row per point.
    """
    import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
    with tempfile.TemporaryDirectory(prefix="timelake-influx-") as tmp, \
            closing(duckdb.connect(config={"memory_limit": _MERGE_MEMORY, "temp_directory": tmp})) as con:
        columns: dict[str, pa.DataType] = {}
        for batch in lines:
            batch = batch.set_column(0, TIME, batch.column(0).cast(pa.int64()))  # DuckDB would drop the nanoseconds
            if not columns:
                con.execute("CREATE TABLE points AS SELECT * FROM batch")
            else:
                for f in batch.schema:
                    if f.name not in columns:
                        con.execute(f"ALTER TABLE points ADD COLUMN {_ident(f.name)} {_DUCK[f.type]}")
                con.execute("INSERT INTO points BY NAME SELECT * FROM batch")
            columns.update({f.name: f.type for f in batch.schema if f.name not in columns})
        if not columns:
            return
        tags = [_ident(t) for t in sorted(parser.tags)]
        fields = [_ident(f) for f in columns if f not in (TIME, LINE) and f not in parser.tags]
        picks = [f"arg_max({f}, {LINE}) FILTER (WHERE {f} IS NOT NULL) AS {f}" for f in fields]
        query = f"SELECT {', '.join([TIME, *tags, *picks])} FROM points GROUP BY {', '.join([TIME, *tags])}"
        for batch in con.sql(query).to_arrow_reader(batch_rows):
            yield batch.set_column(0, TIME, batch.column(0).cast(TIME_TYPE))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
