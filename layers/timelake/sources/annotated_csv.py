"""InfluxDB query results as Flux annotated CSV (what ``influx query --raw`` prints), read as points.

A result is a run of tables, each under its annotation rows (``#group``, ``#datatype``, ``#default``)
and a header, separated by blank lines; ``influx`` writes one table per series and field, with the
columns ``result``, ``table``, ``_start``, ``_stop``, ``_time``, ``_value``, ``_field``,
``_measurement`` and one per tag. So, as for a line-protocol export, the rows of one point are spread
over tables and merged into one row (``line_protocol.points``), the later row winning per field. A
table pivoted into a column per field (``pivot()``, no ``_field``) is read too: its group-key columns
are the tags, its other columns not starting with ``_`` the fields. ``_value`` is typed by the
table's ``#datatype`` (``double``, ``long``, ``unsignedLong``, ``boolean``, ``string``), an empty
cell is the column's ``#default`` (else no value), and ``_time`` is RFC 3339.

The reader keeps ``LineProtocol``'s contract: each field has the type of the first table that holds
it, a key is a tag or a field, and a row it cannot read (a time or value that is not of its type, a
field of another type than before) is an error naming the file and line, or with ``reject`` counted
with examples. A table of a query that failed (columns ``error``, ``reference``) is an error.
"""

from __future__ import annotations

import csv
import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timelake.sources.line_protocol import ARROW_TYPES, LINE, SERIES, TIME, TIME_TYPE, InfluxError

_TYPES = {"double": "float", "long": "integer", "unsignedLong": "unsigned", "boolean": "boolean", "string": "string"}
_TIMES = ("dateTime:RFC3339", "dateTime:RFC3339Nano")
_OWN = ("", "result", "table")  # the annotation column and Flux's own columns, no tag or field
_ROWS = 65_536  # rows converted at a time
_READ = 1 << 20
_EXAMPLES = 5


@dataclass
class _Table:
    """The annotations and header a run of rows is read with."""

    line: int
    names: list[str]
    types: list[str]
    groups: list[bool]
    defaults: list[str]
    rows: list[list[str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)


class AnnotatedCsv:
    """Parses one stream of annotated CSV for one measurement; ``LineProtocol``'s interface, so the
    file source and the merge read it alike."""

    def __init__(self, measurement: str, origin: str, reject: bool = False) -> None:
        self.measurement = measurement
        self.origin = origin
        self.reject = reject
        self.kinds: dict[str, tuple[str, int]] = {}
        self.tags: dict[str, int] = {}
        self.seen: set[str] = set()
        self.rejected = 0
        self.examples: list[str] = []
        self.series: dict[tuple[tuple[str, str], ...], int] = {}

    def batches(self, stream: pa.NativeFile | mmap.mmap) -> Iterator[pa.RecordBatch]:
        """The rows of the measurement, one per CSV row (with its line number in LINE)."""
        for table in self._tables(stream):
            batch = self._read(table)
            if batch is not None and batch.num_rows:
                yield batch

    def scan(self, stream: pa.NativeFile | mmap.mmap) -> pa.Schema:
        for table in self._tables(stream):
            self._read(table)
        return self.schema()

    def schema(self) -> pa.Schema:
        return pa.schema([(TIME, TIME_TYPE), *((t, pa.string()) for t in sorted(self.tags)),
                          *((f, ARROW_TYPES[k]) for f, (k, _) in sorted(self.kinds.items()))])

    def _tables(self, stream: pa.NativeFile | mmap.mmap) -> Iterator[_Table]:
        """Runs of up to _ROWS data rows with the annotations and header above them."""
        annotations: dict[str, list[str]] = {}
        table: _Table | None = None
        reader = csv.reader(_text_lines(stream, self.origin))
        for row in reader:
            line = reader.line_num
            if not row or row == [""]:  # a blank line ends a table's annotations and rows
                if table is not None and table.rows:
                    yield table
                annotations, table = {}, None
                continue
            if row[0].startswith("#"):
                if table is not None and table.rows:
                    yield table
                annotations[row[0]], table = row[1:], None
                continue
            if table is None:  # the header
                if "#datatype" not in annotations:
                    raise InfluxError(f"line {line} of {self.origin}: a table without a #datatype row above its "
                                      "header is not annotated CSV (influx query --raw writes one)")
                if row[1:3] == ["error", "reference"]:
                    error = next(reader, ["", "", ""])
                    raise InfluxError(f"line {line + 1} of {self.origin}: the query failed: {error[1] if len(error) > 1 else ''}")
                table = _Table(line, row[1:], annotations["#datatype"], [g == "true" for g in annotations.get("#group", [])],
                               annotations.get("#default", []))
                continue
            table.rows.append(row[1:])
            table.lines.append(line)
            if len(table.rows) >= _ROWS:
                yield table
                table = _Table(table.line, table.names, table.types, table.groups, table.defaults)
        if table is not None and table.rows:
            yield table

    def _read(self, table: _Table) -> pa.RecordBatch | None:
        """The table's rows of the measurement: tags, each field typed by the table's #datatype, the time."""
        names = table.names
        width = len(names)
        if "_time" not in names:
            raise InfluxError(f"line {table.line} of {self.origin}: a table without a _time column cannot be read "
                              f"as points (columns: {', '.join(names)})")
        types = dict(zip(names, table.types, strict=False))
        groups = dict(zip(names, table.groups, strict=False))
        cells = {name: [row[i] if i < len(row) else "" for row in table.rows] for i, name in enumerate(names)}
        for i, name in enumerate(names):
            default = table.defaults[i] if i < len(table.defaults) else ""
            if default:
                cells[name] = [value or default for value in cells[name]]
        lines = np.asarray(table.lines, dtype=np.int64)
        refused: dict[int, str] = {at: f"{len(row)} columns where the header has {width}"
                                   for at, row in enumerate(table.rows) if len(row) != width}
        measurement = cells.get("_measurement")
        if measurement is None:  # a query that dropped the column: its rows are the measurement's
            ours = np.ones(len(lines), dtype=bool)
            self.seen.add(self.measurement)
        else:
            ours = np.array([name == self.measurement for name in measurement], dtype=bool)
            self.seen.update(measurement)
        time = self._times(cells["_time"], types.get("_time", ""), refused)
        own = [name for name in names if name not in _OWN and not name.startswith("_")]
        if "_field" in names and "_value" in names:  # a row per field value: every other column is a tag
            tags = own
            kind = self._kind(types.get("_value", ""), table.line)
            values = self._values(cells["_value"], kind, "_value", refused, empty=kind == "string")
            for at in np.flatnonzero(_mask(values.is_null())):
                refused.setdefault(int(at), "_value is empty")
            fields = {}
            for name in dict.fromkeys(cells["_field"]):
                pick = pa.array([f == name for f in cells["_field"]])
                fields[name] = (kind, pc.if_else(pick, values, pa.scalar(None, values.type)))
        else:  # pivoted: the group key's columns are the tags, the others the fields
            tags = [name for name in own if groups.get(name, False)]
            fields = {name: (kind, self._values(cells[name], kind, name, refused, empty=False))
                      for name in own if name not in tags for kind in [self._kind(types.get(name, ""), table.line)]}
        problems = [(int(lines[at]), reason) for at, reason in refused.items()]  # of any measurement, as lines
        keep = ours.copy()
        keep[list(refused)] = False
        keep = self._check(fields, tags, cells, keep, lines, problems)
        for line, reason in sorted(problems):
            message = f"line {line} of {self.origin}: {reason}"
            if not self.reject:
                raise InfluxError(message)
            self.rejected += 1
            if len(self.examples) < _EXAMPLES:
                self.examples.append(message)
        if not keep.any():
            return None
        mask = pa.array(keep)
        tag_columns = {name: pa.array([value or None for value in cells[name]], pa.string()).filter(mask) for name in tags}
        tag_columns = {name: column for name, column in sorted(tag_columns.items()) if column.null_count < len(column)}
        rows = zip(*(column.to_pylist() for column in tag_columns.values()), strict=True) if tag_columns else \
            iter([()] * int(keep.sum()))
        numbers = [self.series.setdefault(tuple((name, value) for name, value in zip(tag_columns, row, strict=True)
                                                if value is not None), len(self.series)) for row in rows]
        columns = {TIME: time.filter(mask), LINE: pa.array(lines[keep]), **tag_columns, SERIES: pa.array(numbers, pa.int64())}
        for name, (_, values) in sorted(fields.items()):
            values = values.filter(mask)
            if values.null_count < len(values):
                columns[name] = values
        return pa.RecordBatch.from_pydict(columns)

    def _check(self, fields: dict[str, tuple[str, pa.Array]], tags: list[str], cells: dict[str, list[str]],
               keep: np.ndarray, lines: np.ndarray, problems: list[tuple[int, str]]) -> np.ndarray:
        """The rows whose fields have the type, and whose keys the role, of the first table that held
        them; the others are added to ``problems``."""
        for name in tags:
            holding = keep & np.array([bool(value) for value in cells[name]], dtype=bool)
            if not holding.any():
                continue
            if name not in self.kinds:
                self.tags.setdefault(name, int(lines[int(np.argmax(holding))]))
                continue
            problems.extend((int(line), f"'{name}' of measurement '{self.measurement}' is a field at line "
                                        f"{self.kinds[name][1]} and a tag here: a table column is one or the other")
                            for line in lines[holding])
            keep &= ~holding
        for name, (kind, values) in fields.items():
            holding = keep & _mask(values.is_valid())
            if not holding.any():
                continue
            if name in self.tags:
                reason = (f"'{name}' of measurement '{self.measurement}' is a tag at line {self.tags[name]} and a "
                          "field here: a table column is one or the other")
            else:
                known = self.kinds.setdefault(name, (kind, int(lines[int(np.argmax(holding))])))
                if known[0] == kind:
                    continue
                reason = (f"field '{name}' of measurement '{self.measurement}' has two types in {self.origin}: "
                          f"{known[0]} at line {known[1]} and {kind} here")
            problems.extend((int(line), reason) for line in lines[holding])
            keep &= ~holding
        return keep

    def _kind(self, datatype: str, line: int) -> str:
        if datatype not in _TYPES:
            raise InfluxError(f"line {line} of {self.origin}: a value of #datatype '{datatype}' cannot be a field "
                              f"(known: {', '.join(_TYPES)})")
        return _TYPES[datatype]

    def _times(self, texts: list[str], datatype: str, refused: dict[int, str]) -> pa.Array:
        if datatype not in _TIMES:
            raise InfluxError(f"{self.origin}: _time is of #datatype '{datatype}', not an RFC 3339 time")
        return self._cast(texts, TIME_TYPE, "_time", refused, "not an RFC 3339 time")

    def _values(self, texts: list[str], kind: str, name: str, refused: dict[int, str], empty: bool) -> pa.Array:
        """A column of values of ``kind``; an empty text is no value, or with ``empty`` the empty string."""
        if kind == "string":
            return pa.array(texts if empty else [text or None for text in texts], pa.string())
        if kind == "boolean":
            valid = [text in ("true", "false", "") for text in texts]
            for at in (at for at, ok in enumerate(valid) if not ok):
                refused.setdefault(at, f"{name} {texts[at]!r} is not a boolean")
            return pa.array([None if text == "" or not ok else text == "true" for text, ok in zip(texts, valid, strict=True)],
                            pa.bool_())
        return self._cast(texts, ARROW_TYPES[kind], name, refused, f"not a {kind}")

    def _cast(self, texts: list[str], to: pa.DataType, name: str, refused: dict[int, str], what: str) -> pa.Array:
        """The texts cast to ``to`` (empty: no value); a text that does not cast is refused, its row's value null."""
        array = pa.array([text or None for text in texts], pa.string())
        try:
            return array.cast(to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = []
            for at, text in enumerate(texts):
                try:
                    values.append(pa.scalar(text or None, pa.string()).cast(to))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    refused.setdefault(at, f"{name} {text!r} is {what}")
                    values.append(pa.scalar(None, to))
            return pa.array([value.as_py() for value in values], to)


def _text_lines(stream: pa.NativeFile | mmap.mmap, origin: str) -> Iterator[str]:
    """The stream's lines as text, with their line ends (the CSV reader reads values across lines)."""
    rest = b""
    number = 1
    while True:
        block = stream.read(_READ)
        if not block:
            break
        lines = (rest + bytes(block)).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield _decoded(line + b"\n", number, origin)
            number += 1
    if rest:
        yield _decoded(rest, number, origin)


def _decoded(line: bytes, number: int, origin: str) -> str:
    try:
        return line.decode()
    except UnicodeDecodeError as e:
        raise InfluxError(f"line {number} of {origin}: not UTF-8 text (byte {e.start + 1})") from None


def _mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)
