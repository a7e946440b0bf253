"""Wide exports: one column per series (Ignition tag history, AVEVA WideHistory, an Excel sheet).

A wide source is read as the long one it stands for: every column but the time and the named id
columns becomes rows, the column's name the series key (split at a separator into several key
columns when asked) and its cells the value; blank cells are no sample and make no row. Rows come
in line order (a line's cells one after another), so the lines' own order tells a clock change
apart for every series at once, blanks or not.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timelake.sources.base import Source, SourceBatch, SourceError

#: rows a wide batch is cut into at most once unpivoted (a batch of 262,144 lines × 500 tags would be 131M)
OUTPUT_ROWS = 262_144


class WideSource(Source):
    """``inner`` unpivoted: columns ``time`` and ``ids`` as they are, then ``keys`` (from each other column's
    name) and ``value`` (its cells: numbers when every such column holds numbers, else text)."""

    def __init__(self, inner: Source, time: str, ids: list[str], keys: list[str], value: str,
                 separator: str | None = None) -> None:
        if not keys:
            raise SourceError("a wide source needs a table with a series key: the column names become its values")
        if len(keys) > 1 and separator is None:
            raise SourceError(f"the table's series key has {len(keys)} columns ({', '.join(keys)}): give "
                              "key_separator (--key-separator) to split each column name into them")
        self.inner, self.time, self.ids, self.keys, self.value, self.separator = inner, time, ids, keys, value, separator
        self.uri = inner.uri

    def pieces(self) -> list[str]:
        return self.inner.pieces()

    def fingerprint(self) -> str:
        return self.inner.fingerprint()

    def sizes(self) -> list[int]:
        return self.inner.sizes()

    def plan_state(self) -> dict | None:
        return self.inner.plan_state()

    def read_next(self, pieces: list[str]) -> None:
        self.inner.read_next(pieces)

    def share_cores(self) -> None:
        self.inner.share_cores()

    def schema(self) -> pa.Schema:
        schema = self.inner.schema()
        series = self._series(schema, "the first piece")
        kept = [schema.field(name) for name in [self.time, *self.ids]]
        kind = _value_type([schema.field(name).type for name in series])
        return pa.schema([*kept, *(pa.field(k, pa.string()) for k in self.keys), pa.field(self.value, kind)])

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        for batch in self.inner.batches(piece):
            yield from self._long(batch)

    def read(self, pieces: list[str]) -> Iterator[SourceBatch]:
        for batch in self.inner.read(pieces):
            yield from self._long(batch)

    def _series(self, schema: pa.Schema, where: str) -> list[str]:
        names = schema.names
        for name in [self.time, *self.ids]:
            if name not in names:
                raise SourceError(f"wide source: column '{name}' is not in {where} (columns: {', '.join(names)})")
        series = [n for n in names if n not in (self.time, *self.ids)]
        if not series:
            raise SourceError(f"wide source: {where} has no columns besides the time and id columns to turn into series")
        return series

    def _split(self, names: list[str], where: str) -> list[list[str]]:
        """Each column name as the values of the key columns."""
        if self.separator is None:
            return [[n] for n in names]
        parts = [n.split(self.separator) for n in names]
        wrong = next((n for n, p in zip(names, parts, strict=True) if len(p) != len(self.keys)), None)
        if wrong is not None:
            raise SourceError(f"wide source: column '{wrong}' of {where} does not split at '{self.separator}' into "
                              f"{len(self.keys)} parts ({', '.join(self.keys)})")
        return parts

    def _long(self, batch: SourceBatch) -> Iterator[SourceBatch]:
        """A wide batch as long batches of at most OUTPUT_ROWS rows: a run of lines, one column after another."""
        series = self._series(batch.data.schema, batch.origin)
        parts = self._split(series, batch.origin)
        kind = _value_type([batch.data.schema.field(n).type for n in series])
        step = max(1, OUTPUT_ROWS // len(series))
        for start in range(0, batch.data.num_rows, step):
            lines = batch.data.slice(start, step)
            yield self._unpivot(batch, lines, start, series, parts, kind)

    def _unpivot(self, batch: SourceBatch, lines: pa.RecordBatch, start: int, series: list[str],
                 parts: list[list[str]], kind: pa.DataType) -> SourceBatch:
        """The cells of ``lines`` as rows in line order (a line's series one after another), blanks left out."""
        n, m = lines.num_rows, len(series)
        by_column = pa.concat_arrays([_as(lines.column(name), kind) for name in series])
        order = np.arange(n * m).reshape(m, n).T.reshape(-1)  # row-major: line 0's cells, then line 1's
        cells = by_column.take(pa.array(order))
        present = pc.is_valid(cells).to_numpy(zero_copy_only=False)
        if kind == pa.string():  # a cell of spaces is as blank as an empty one
            present &= pc.fill_null(pc.utf8_length(pc.utf8_trim_whitespace(cells)), 0).to_numpy(zero_copy_only=False) > 0
        at = np.flatnonzero(present)
        line, column = at // m, at % m
        taken = pa.array(line)
        arrays = [lines.column(name).take(taken) for name in [self.time, *self.ids]]
        for k in range(len(self.keys)):
            names = pa.array([p[k] for p in parts], pa.string())
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(column.astype(np.int32)), names))
        arrays.append(cells.take(pa.array(at)))
        fields = [lines.schema.field(self.time), *(lines.schema.field(i) for i in self.ids),
                  *(pa.field(k, pa.dictionary(pa.int32(), pa.string())) for k in self.keys), pa.field(self.value, kind)]
        data = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
        first = batch.row_offset + start

        def locate(i: int) -> str:
            place = SourceBatch(batch.data, batch.origin, first, line=None if batch.line is None else batch.line + start)
            return f"{place.where(int(line[i]))}, column '{series[int(column[i])]}'"

        return SourceBatch(data, batch.origin, first, locate=locate)


def _value_type(kinds: list[pa.DataType]) -> pa.DataType:
    """One type for the cells of every series column: numbers stay numbers, anything else is read as text."""
    plain = [k.value_type if pa.types.is_dictionary(k) else k for k in kinds]
    if all(pa.types.is_integer(k) or pa.types.is_floating(k) or pa.types.is_null(k) for k in plain):
        return pa.int64() if all(pa.types.is_integer(k) or pa.types.is_null(k) for k in plain) else pa.float64()
    return pa.string()


def _as(column: pa.Array, kind: pa.DataType) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column if column.type == kind else column.cast(kind)
