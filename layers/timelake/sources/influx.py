"""InfluxDB as a backfill source: line-protocol export files and a live InfluxDB 1.x server.

One job fills one table, so one measurement is read (``measurement``, else the table's name);
tags become string columns (the series key) and fields typed columns, next to a UTC ``time``
column. Export files are streamed through ``line_protocol`` (InfluxDB 1.x or 2.x line protocol),
one file per piece. A server is read one day of data per piece with chunked queries, so pieces
re-open in any worker from the URI alone and no response is held whole.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs

from timelake.model.limits import INFLUX_SCHEME
from timelake.model.timeutil import US_PER_DAY
from timelake.sources.annotated_csv import AnnotatedCsv
from timelake.sources.base import FileSource, Source, SourceBatch, SourceError, _list_files, _rebatch
from timelake.sources.line_protocol import ARROW_TYPES, TIME, TIME_TYPE, InfluxError, LineProtocol, points

DIALECTS = {"influx": 1, "influx2": 2}  # the line-protocol formats: InfluxDB 1.x (influx_inspect export), 2.x (export-lp)
ANNOTATED = "influx-csv"  # Flux annotated CSV, as influx query --raw prints it
_ANNOTATIONS = (b"#group,", b"#datatype,", b"#default,")

_QUERY_CHUNK_ROWS = 50_000
_COMPRESSED = (".bz2", ".gz", ".lz4", ".zst")  # what Arrow decompresses by name
_BYTES_PER_POINT = 48  # a rough Parquet size of one point, only to balance pieces across scan tasks


def is_influx_uri(uri: str) -> bool:
    return uri.startswith(INFLUX_SCHEME)


def is_line_protocol(uri: str) -> bool:
    return uri.lower().removesuffix(".gz").endswith((".lp", ".line"))

class InfluxFileSource(FileSource):
    """Export files; each file is one piece, read in one stream (a gzip stream cannot be split).

    ``kind`` is the format (a key of DIALECTS); with ``reject`` the lines InfluxDB would refuse are left
    out and counted (``bad_line``, with examples) on the last batch of their file.
    """

    def __init__(self, uri: str, fs: pafs.FileSystem, paths: dict[str, str], measurement: str, precision: str,
                 batch_rows: int, kind: str = "influx", reject: bool = False) -> None:
        super().__init__(uri, fs, paths, dict.fromkeys(paths, "influx"), batch_rows)
        self.measurement = measurement
        self.precision = precision
        self.kind = kind
        self.reject = reject

    def schema(self) -> pa.Schema:
        """Every tag and field of the first file: an export lists each field of a series in its own
        run of lines, so the first chunk does not know them all. This pass also finds a field with
        two types, and a missing measurement, before the job is planned."""
        piece = next(iter(self._paths))
        parser = self._parser(piece)
        with self._readable(piece), self._lines(self._paths[piece]) as stream:
            schema = parser.scan(stream)
        if not parser.kinds:
            seen = ", ".join(sorted(parser.seen)) or "none"
            raise InfluxError(f"measurement '{self.measurement}' is not in {piece} (measurements: {seen}); "
                              "choose one with --measurement")
        return schema

    def _parser(self, piece: str) -> LineProtocol | AnnotatedCsv:
        if self.kind == ANNOTATED:
            return AnnotatedCsv(self.measurement, piece, self.reject)
        return LineProtocol(self.measurement, self.precision, piece, DIALECTS[self.kind], self.reject)

    def _read(self, piece: str) -> Iterator[SourceBatch]:
        parser = self._parser(piece)
        offset = 0
        with self._readable(piece), self._lines(self._paths[piece]) as stream:
            for batch in _rebatch(points(parser, parser.batches(stream), self._batch_rows), self._batch_rows):
                yield SourceBatch(batch, piece, offset)
                offset += batch.num_rows
        if parser.rejected:
            yield SourceBatch(pa.RecordBatch.from_pylist([], parser.schema()), piece, offset, rejected=parser.rejected,
                              examples=tuple(parser.examples))

    @contextmanager
    def _lines(self, path: str) -> Iterator[pa.NativeFile | mmap.mmap]:
        """A local file that is not compressed is memory-mapped: the parsing threads then read their
        chunks straight from the page cache, where a stream is copied by one thread. A file cut
        short while it is read is named before each chunk (``LineProtocol._split``); cut inside a
        chunk being read, it stops the process, as any reader of a mapped file."""
        if isinstance(self._fs, pafs.LocalFileSystem) and not path.endswith(_COMPRESSED):
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size:  # an empty file cannot be mapped
                    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    try:
                        yield mapped
                    finally:
                        with suppress(BufferError):  # views an error's traceback still holds: unmapped with them
                            mapped.close()
                    return
        with self._open(path) as stream:
            yield stream


def is_annotated_csv(uri: str) -> bool:
    """Whether a CSV file (the first the URI names) begins with a Flux annotation row, as the output of
    ``influx query --raw`` does: then it is read as InfluxDB points, not as a plain CSV."""
    if not uri.lower().removesuffix(".gz").endswith(".csv"):
        return False
    try:
        fs, _, paths = _list_files(uri, known_only=False)
        if not paths:
            return False
        with fs.open_input_stream(sorted(paths)[0], compression="detect") as stream:
            return stream.read(16).startswith(_ANNOTATIONS)
    except (OSError, pa.ArrowException, SourceError):
        return False


def open_influx_files(uri: str, measurement: str, precision: str | None, batch_rows: int, kind: str = "influx",
                      reject: bool = False) -> InfluxFileSource:
    fs, prefix, paths = _list_files(uri, known_only=False)
    if not paths:
        raise SourceError(f"no source files match '{uri}'")
    pieces = {prefix + path: path for path in sorted(paths)}
    return InfluxFileSource(uri, fs, pieces, measurement, precision or "ns", batch_rows, kind, reject)


class InfluxServerSource(Source):
    """A measurement of a live InfluxDB 1.x database; a piece is one UTC day that holds points."""

    def __init__(self, uri: str, measurement: str | None, batch_rows: int) -> None:
        url = urllib.parse.urlsplit(uri)
        options = urllib.parse.parse_qs(url.query)
        self.uri = uri
        self.database = url.path.strip("/")
        self.measurement = (options.get("measurement") or [measurement])[0]
        if not self.database or not self.measurement:
            raise SourceError(f"'{uri}' must be influx://host:port/database?measurement=name")
        self.endpoint = f"{'https' if options.get('tls') == ['true'] else 'http'}://{url.hostname}:{url.port or 8086}"
        if url.password:
            raise SourceError("put the InfluxDB password in INFLUX_PASSWORD, not in the URI: the URI is stored in the job")
        self.user = url.username or os.environ.get("INFLUX_USERNAME")
        self.password = os.environ.get("INFLUX_PASSWORD")
        self._batch_rows = batch_rows
        self._days: list[tuple[int, int]] | None = None
        self._text_fields: list[str] = []

    def pieces(self) -> list[str]:
        return [f"{self.measurement}@{np.datetime64(day * US_PER_DAY, 'us').astype('datetime64[D]')}"
                for day, _ in self._counts()]

    def sizes(self) -> list[int]:
        return [count * _BYTES_PER_POINT for _, count in self._counts()]

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps([self.uri, self._counts()]).encode()).hexdigest()

    def schema(self) -> pa.Schema:
        tags = [row[0] for row in self._rows(f"SHOW TAG KEYS FROM {self._quoted()}")]
        fields: dict[str, str] = {}
        for name, kind in self._rows(f"SHOW FIELD KEYS FROM {self._quoted()}"):
            if fields.setdefault(name, kind) != kind:
                raise InfluxError(f"field '{name}' of measurement '{self.measurement}' has two types in database "
                                  f"'{self.database}': {fields[name]} and {kind}")
        self._text_fields = [name for name, kind in fields.items() if kind == "string"]
        if not fields:
            names = ", ".join(row[0] for row in self._rows("SHOW MEASUREMENTS")) or "none"
            raise SourceError(f"measurement '{self.measurement}' is not in InfluxDB database '{self.database}' "
                              f"at {self.endpoint} (measurements: {names})")
        return pa.schema([(TIME, TIME_TYPE), *((t, pa.string()) for t in sorted(tags)),
                          *((f, ARROW_TYPES[k]) for f, k in sorted(fields.items()))])

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        names = self.pieces()
        if piece is not None and piece not in names:
            raise SourceError(f"{piece} is not a piece of source '{self.uri}'")
        schema = self.schema()
        for name, (day, _) in zip(names, self._counts(), strict=True):
            if piece in (None, name):
                yield from self._read_day(name, day, schema)

    def _read_day(self, name: str, day: int, schema: pa.Schema) -> Iterator[SourceBatch]:
        lo, hi = day * US_PER_DAY * 1000, (day + 1) * US_PER_DAY * 1000
        query = f"SELECT * FROM {self._quoted()} WHERE time >= {lo} AND time < {hi}"
        offset = 0
        reader = self._json_batches if self._text_fields else self._csv_batches
        for batch in _rebatch(reader(query, schema), self._batch_rows):
            yield SourceBatch(batch, name, offset)
            offset += batch.num_rows

    def _csv_batches(self, query: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """Points as CSV, parsed by Arrow: twice the speed of JSON decoded in Python. CSV cannot tell an
        empty string from a missing value, so measurements with string fields are read as JSON."""
        types = {TIME: pa.int64(), **{f.name: f.type for f in schema if f.name != TIME}}
        convert = pcsv.ConvertOptions(column_types=types, include_columns=list(types), include_missing_columns=True,
                                      strings_can_be_null=True)
        with self._response(query, "application/csv") as response:
            if not response.peek(1):  # no points: no header either
                return
            for batch in pcsv.open_csv(response, convert_options=convert):
                yield pa.RecordBatch.from_arrays([batch.column(0).cast(TIME_TYPE), *batch.columns[1:]], schema=schema)

    def _json_batches(self, query: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        for series in self._series(query):
            rows = series.get("values") or []
            if not rows:
                continue
            data = dict(zip(series["columns"], zip(*rows, strict=True), strict=True))
            arrays = [pa.array(data[TIME], pa.int64()).cast(TIME_TYPE)]
            arrays += [pa.array(data.get(f.name, [None] * len(rows)), f.type) for f in schema if f.name != TIME]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _counts(self) -> list[tuple[int, int]]:
        """Points per UTC day (days without points are left out): from the server, at plan and in each worker."""
        if self._days is None:
            self.schema()
            bounds = [self._rows(f"SELECT * FROM {self._quoted()} ORDER BY time {order} LIMIT 1")
                      for order in ("ASC", "DESC")]
            if not bounds[0]:
                self._days = []
                return self._days
            lo_day, hi_day = (int(rows[0][0]) // (US_PER_DAY * 1000) for rows in bounds)
            query = (f"SELECT count(*) FROM {self._quoted()} WHERE time >= {lo_day * US_PER_DAY * 1000} "
                     f"AND time < {(hi_day + 1) * US_PER_DAY * 1000} GROUP BY time(1d) fill(none)")
            self._days = [(int(row[0]) // (US_PER_DAY * 1000), max(int(v or 0) for v in row[1:]))
                          for row in self._rows(query)]
        return self._days

    def _quoted(self) -> str:
        return '"' + self.measurement.replace('"', '\\"') + '"'

    def _rows(self, query: str) -> list[list]:
        return [row for series in self._series(query) for row in series.get("values", [])]

    def _series(self, query: str) -> Iterator[dict]:
        """Series of a chunked query; one JSON document per line, each a chunk of at most _QUERY_CHUNK_ROWS."""
        with self._response(query, "application/json") as response:
            for line in response:
                if line.strip():
                    yield from self._checked(json.loads(line))

    @contextmanager
    def _response(self, query: str, accept: str) -> Iterator[Any]:
        params = {"db": self.database, "q": query, "epoch": "ns", "chunked": "true", "chunk_size": _QUERY_CHUNK_ROWS}
        if self.user:
            params.update(u=self.user, p=self.password or "")
        request = urllib.request.Request(f"{self.endpoint}/query?{urllib.parse.urlencode(params)}",
                                         headers={"Accept": accept})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                yield response
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace").strip()
            raise SourceError(f"InfluxDB at {self.endpoint} refused '{query[:60]}': HTTP {e.code} {detail}") from e
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise SourceError(f"cannot reach InfluxDB at {self.endpoint}: {reason}") from e

    def _checked(self, document: dict) -> Iterator[dict]:
        if "error" in document:
            raise SourceError(f"InfluxDB at {self.endpoint}: {document['error']}")
        for result in document.get("results", []):
            if "error" in result:
                raise SourceError(f"InfluxDB database '{self.database}' at {self.endpoint}: {result['error']}")
            yield from result.get("series", [])
