"""Reading a backfill source in bounded-memory batches.

A backfill may cover years of exports, so nothing here ever holds a whole file
in memory: every format is streamed and cut into batches of at most
``batch_rows`` rows, each tagged with its file and row offset so that a bad
value deep inside a large file can be reported precisely.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.json as pjson
import pyarrow.parquet as pq

from timelake.errors import SourceError
from timelake.model.layout import footer_bounds
from timelake.ports.files import reads_at_once

if TYPE_CHECKING:
    import pandas

MEMORY = "<memory>"
_FORMATS = {
    ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json", ".json": "json"
}
_KNOWN_EXTENSIONS = ", ".join([*_FORMATS, *(f"{ext}.gz" for ext, fmt in _FORMATS.items() if fmt != "parquet")])
_KIND = {"parquet": "Parquet", "csv": "CSV", "json": "newline-delimited JSON", "influx": "InfluxDB line-protocol"}
# JSON is parsed a chunk of whole lines at a time; this bounds memory per chunk.
_JSON_CHUNK_BYTES = 32 << 20
_GLOB_TOKEN = re.compile(r"\*\*/|\*\*|\*|\?|[^*?]+")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


@dataclass(frozen=True)
class CsvOptions:
    """How a CSV export is written: real historian exports use ';', preambles, and non-UTF-8 text.

    ``null_values`` are the cells read as no value; the default leaves "NA" alone, since it is a real
    value in series keys (country codes) more often than a marker, and a job names its markers.
    """

    delimiter: str = ","
    skip_rows: int = 0
    encoding: str = "utf-8"
    null_values: tuple[str, ...] = ("", "NULL", "null")
    skip_after_header: int = 0  # lines between the header and the data (a units line, as Excel exports add)

    @property
    def first_line(self) -> int:
        """The file line of the first data row: the skipped lines, the header and the lines after it come first."""
        return self.skip_rows + 1 + self.skip_after_header + 1


@dataclass(frozen=True)
class SourceBatch:
    """Raw rows plus where they came from, so that later errors can say "line N of file" (text files, whose
    readers know the line of the batch's first row), or "row N of file" counted from 1. ``locate`` names a
    row's place where a reader reshaped the rows (a wide export's cell: its line and column)."""

    data: pa.RecordBatch
    origin: str
    row_offset: int
    rejected: int = 0  # lines of the origin left out as unreadable (a line-protocol file read with reject)
    examples: tuple[str, ...] = ()  # some of them, each naming its line and why
    line: int | None = None
    locate: Callable[[int], str] | None = None

    def where(self, index: int) -> str:
        """Where row ``index`` of the batch is in its source, as a person finds it in an editor."""
        if self.locate is not None:
            return self.locate(index)
        if self.line is not None:
            return f"line {self.line + index} of {self.origin}"
        return f"row {self.row_offset + index + 1} of {self.origin}"


class Source(ABC):
    """A set of pieces (files, or one in-memory piece) that can be read batch by batch.

    Pieces are exposed so that a planner can fan out one worker per file and
    record progress per file; ``fingerprint`` lets a resumed job detect that the
    input changed underneath it.
    """

    uri: str

    @abstractmethod
    def pieces(self) -> list[str]:
        """The pieces in a deterministic order, so that plans are reproducible."""

    @abstractmethod
    def schema(self) -> pa.Schema:
        """The raw schema of the first piece, used to validate a mapping before any data is read."""

    @abstractmethod
    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        """Every piece in order, or only ``piece``; batches hold at most ``batch_rows`` rows."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A sha256 hex digest that changes when the input changes; cheap because no data is read."""

    @abstractmethod
    def sizes(self) -> list[int]:
        """Bytes of each piece (as stored), so a planner can group small pieces into even scan tasks."""

    def read(self, pieces: list[str]) -> Iterator[SourceBatch]:
        """The batches of ``pieces`` in order (a scan task's run); a source may read ahead."""
        for piece in pieces:
            yield from self.batches(piece)

    def read_next(self, pieces: list[str]) -> None:
        """A hint: the next ``read`` starts with ``pieces``. A source that reads ahead starts on them
        once the current read has fetched its last piece, so one process scanning task after task
        never waits for a task's first piece; other sources ignore it."""

    def read_dictionaries(self, columns: set[str]) -> None:
        """A hint: the caller wants these source columns dictionary-encoded. A format that stores them
        so (Parquet) returns them so, without building each row's string; others ignore it."""

    def share_cores(self) -> None:
        """A hint: other scans run beside this one, a worker per core, so a read decodes on its caller's
        thread. A format whose reader has threads of its own (Parquet) would only hand each batch's
        columns to them and back; others ignore it."""

    def column_bounds(self, column: str) -> list[tuple[pa.DataType, int, int, int]] | None:
        """Per piece, an integer or timestamp ``column``'s type, least and greatest value (as the integers
        stored; meaningless for a piece of no rows) and the piece's rows, from metadata only (Parquet
        footers); None when a piece cannot tell (another format, another type, no statistics, nulls)."""
        return None

    def on_partition_edges(self) -> bool:
        """Whether the pieces were cut on the table's partition edges, so that a piece over several
        partitions holds each of them whole (a database cut by time); files are whatever was exported."""
        return False

    def plan_state(self) -> dict | None:
        """What a scan in another process needs to see the same pieces, kept with the job; None when
        listing the pieces again gives the same list (files), not so for a live database."""
        return None


class FileSource(Source):
    """Files on a local or remote filesystem, all of one known format each."""

    def __init__(
        self, uri: str, fs: pafs.FileSystem, paths: dict[str, str], formats: dict[str, str], batch_rows: int,
        csv: CsvOptions | None = None,
    ) -> None:
        """``paths`` maps piece names (as shown to users) to filesystem paths; ``formats`` maps them to formats."""
        self.uri = uri
        self._fs = fs
        self._paths = paths
        self._formats = formats
        self._batch_rows = batch_rows
        self._csv_options = csv or CsvOptions()
        self._dictionaries: set[str] = set()
        self._decode_threads = True  # see share_cores

    def pieces(self) -> list[str]:
        return list(self._paths)

    def schema(self) -> pa.Schema:
        piece = next(iter(self._paths))
        path, fmt = self._paths[piece], self._formats[piece]
        with self._readable(piece):
            if fmt == "parquet":
                with self._fs.open_input_file(path) as f:
                    return pq.ParquetFile(f).schema_arrow
            if fmt == "csv":
                return pa.schema([(name, pa.string()) for name in self._csv_names(path)])
            with closing(self._json(path)) as batches:
                first = next(batches, None)
            return first.schema if first is not None else pa.schema([])

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        if piece is not None and piece not in self._paths:
            raise SourceError(f"{piece} is not a piece of source '{self.uri}'")
        for name in [piece] if piece is not None else self._paths:
            yield from self._read(name)

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for piece, info in zip(self._paths, self._fs.get_file_info(list(self._paths.values())), strict=True):
            if info.type != pafs.FileType.File:
                raise SourceError(f"source file {piece} no longer exists")
            digest.update(f"{piece}\0{info.size}\0{info.mtime_ns}\n".encode())
        return digest.hexdigest()

    def sizes(self) -> list[int]:
        return [info.size or 0 for info in self._fs.get_file_info(list(self._paths.values()))]

    def _read(self, piece: str) -> Iterator[SourceBatch]:
        path, fmt = self._paths[piece], self._formats[piece]
        reader = getattr(self, f"_{fmt}")  # a subclass adds a format with a method of its name
        first_line = self._csv_options.first_line if fmt == "csv" else 1 if fmt == "json" else None
        offset = 0
        with self._readable(piece):
            for batch in _rebatch(reader(path), self._batch_rows):
                yield SourceBatch(batch, piece, offset, line=None if first_line is None else first_line + offset)
                offset += batch.num_rows

    @contextmanager
    def _readable(self, piece: str) -> Iterator[None]:
        """Turn reader failures into one error type that names the file, wherever the failure surfaces."""
        try:
            yield
        except (pa.ArrowException, OSError) as e:
            raise SourceError(f"{piece} is not a readable {_KIND[self._formats[piece]]} file: {e}") from e

    def _open(self, path: str) -> pa.NativeFile:
        return self._fs.open_input_stream(path, compression="detect")

    def read_dictionaries(self, columns: set[str]) -> None:
        self._dictionaries = set(columns)

    def share_cores(self) -> None:
        self._decode_threads = False

    def column_bounds(self, column: str) -> list[tuple[pa.DataType, int, int, int]] | None:
        if any(fmt != "parquet" for fmt in self._formats.values()):
            return None
        # a footer is a small read: latency-bound on S3, microseconds on a local disk, where threads only took
        # turns with the interpreter (300 footers: 26-31 ms on one thread, 70-105 ms on 16)
        at_once = reads_at_once(self._fs)
        if at_once == 1:
            bounds = [_footer_bounds(self._fs, path, column) for path in self._paths.values()]
        else:
            with ThreadPoolExecutor(max_workers=at_once) as pool:
                bounds = list(pool.map(lambda path: _footer_bounds(self._fs, path, column), self._paths.values()))
        found = [b for b in bounds if b is not None]
        return found if len(found) == len(bounds) else None

    def _parquet(self, path: str) -> Iterator[pa.RecordBatch]:
        """The file opened once (pyarrow's ``ParquetFile`` costs a tenth of a millisecond in Python, a
        per-device source's file a few hundred microseconds to read), asking for every wanted dictionary;
        a file without some of those columns is opened again for those it has."""
        with self._fs.open_input_file(path) as f:
            try:
                parquet = pq.ParquetFile(f, read_dictionary=sorted(self._dictionaries) or None)
            except KeyError:  # pyarrow's answer to a read_dictionary column the file lacks
                metadata = pq.read_metadata(f)
                wanted = sorted(self._dictionaries & set(metadata.schema.names)) or None
                parquet = pq.ParquetFile(f, metadata=metadata, read_dictionary=wanted)
            yield from parquet.iter_batches(batch_size=self._batch_rows, use_threads=self._decode_threads)

    def _csv_names(self, path: str) -> list[str]:
        """Header names, found by a first short read; an entirely empty file has no columns."""
        with self._open(path) as f:
            if not f.read(1):
                return []
        with self._open(path) as f:
            return pcsv.open_csv(f, **self._csv_reading()).schema.names

    def _csv_reading(self) -> dict:
        o = self._csv_options
        return {"read_options": pcsv.ReadOptions(skip_rows=o.skip_rows, encoding=o.encoding,
                                                 skip_rows_after_names=o.skip_after_header),
                "parse_options": pcsv.ParseOptions(delimiter=o.delimiter)}

    def _csv(self, path: str) -> Iterator[pa.RecordBatch]:
        """Every column is read as text: inferring per block lets blocks disagree, and the mapping casts anyway.
        The columns the caller wants coded (`read_dictionaries`: series keys, repeated on every row) come
        as dictionaries, which the reader builds as it parses, cheaper than a string a row."""
        names = self._csv_names(path)
        if not names:
            return
        coded = pa.dictionary(pa.int32(), pa.string())
        convert = pcsv.ConvertOptions(
            column_types={name: coded if name in self._dictionaries else pa.string() for name in names},
            strings_can_be_null=True, null_values=list(self._csv_options.null_values),
        )
        with self._open(path) as f:
            yield from pcsv.open_csv(f, convert_options=convert, **self._csv_reading())

    def _json(self, path: str) -> Generator[pa.RecordBatch, None, None]:
        """Parse chunks of whole lines rather than using the streaming reader.

        The streaming reader fixes every type from its first block and then
        fails on sparse fields (null at first, numbers later), which real
        exports are full of. Date-like fields are kept as text because the
        reader would silently drop their UTC offsets.
        """
        as_text: dict[str, pa.DataType] = {}
        with self._open(path) as f:
            for chunk in _line_chunks(f, _JSON_CHUNK_BYTES):
                while True:
                    options = pjson.ParseOptions(
                        explicit_schema=pa.schema(as_text) if as_text else None, unexpected_field_behavior="infer"
                    )
                    table = pjson.read_json(pa.BufferReader(chunk), parse_options=options)
                    dated = [f.name for f in table.schema if pa.types.is_timestamp(f.type)]
                    if not dated:
                        break
                    as_text.update(dict.fromkeys(dated, pa.string()))
                yield from table.to_batches()


class MemorySource(Source):
    """Data already in this process.

    A RecordBatchReader can be read only once, so it is drained into a table on
    first use (``schema`` excepted); its rows then stay in memory, which is the
    price of being able to read, fingerprint and re-read it like a file.
    """

    def __init__(self, data: pa.Table | pa.RecordBatchReader, uri: str, batch_rows: int) -> None:
        self.uri = uri
        self._data = data
        self._batch_rows = batch_rows

    def pieces(self) -> list[str]:
        return [MEMORY]

    def sizes(self) -> list[int]:
        return [self._data.nbytes if isinstance(self._data, pa.Table) else 0]

    def schema(self) -> pa.Schema:
        return self._data.schema

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        if piece not in (None, MEMORY):
            raise SourceError(f"{piece} is not a piece of source '{self.uri}'")
        offset = 0
        for batch in _rebatch(self._table().to_batches(), self._batch_rows):
            yield SourceBatch(batch, MEMORY, offset)
            offset += batch.num_rows

    def fingerprint(self) -> str:
        schema = self._data.schema.remove_metadata().serialize().to_pybytes()
        return hashlib.sha256(schema + str(self._table().num_rows).encode()).hexdigest()

    def _table(self) -> pa.Table:
        if isinstance(self._data, pa.RecordBatchReader):
            self._data = self._data.read_all()
        return self._data


def open_source(
    source: str | pa.Table | pa.RecordBatchReader | pandas.DataFrame,
    *,
    format: str | None = None,
    batch_rows: int = 262_144,
    csv: CsvOptions | None = None,
) -> Source:
    """Open a path, directory, glob, URI or in-memory table as a :class:`Source`.

    Files are listed (and their formats decided) here, so that a typo or an
    unknown extension fails before any job is planned. ``format`` overrides the
    extension and is ignored for in-memory data. A pandas DataFrame keeps any
    index other than the default range as a column (named after the index),
    because time series often carry their timestamps there.
    """
    if batch_rows < 1:
        raise SourceError(f"batch_rows must be positive, got {batch_rows}")
    if isinstance(source, pa.Table):
        return MemorySource(source, f"<pyarrow.Table {source.num_rows} rows>", batch_rows)
    if isinstance(source, pa.RecordBatchReader):
        return MemorySource(source, "<pyarrow.RecordBatchReader>", batch_rows)
    if type(source).__module__.partition(".")[0] == "pandas":
        return MemorySource(pa.Table.from_pandas(source), f"<pandas.DataFrame {len(source)} rows>", batch_rows)
    if not isinstance(source, str):
        raise SourceError(f"cannot read a source of type {type(source).__name__}")
    forced = _format_named(format) if format is not None else None
    fs, prefix, paths = _list_files(source, known_only=forced is None)
    if not paths:
        raise SourceError(f"no source files match '{source}'")
    pieces = {prefix + path: path for path in sorted(paths)}
    return FileSource(source, fs, pieces, {p: forced or _format_of(p) for p in pieces}, batch_rows, csv)


def _format_named(format: str) -> str:
    fmt = _FORMATS.get("." + format.lower().lstrip("."))
    if fmt is None:
        raise SourceError(f"unknown source format '{format}': use parquet, csv or json")
    return fmt


def _format_of(path: str) -> str:
    fmt = _guess_format(path)
    if fmt is None:
        raise SourceError(
            f"cannot tell the format of {path}: known extensions are {_KNOWN_EXTENSIONS} (or pass format=...)"
        )
    return fmt


def _guess_format(path: str) -> str | None:
    name = path.lower()
    fmt = next((f for ext, f in _FORMATS.items() if name.removesuffix(".gz").endswith(ext)), None)
    return None if fmt == "parquet" and name.endswith(".gz") else fmt


def _list_files(source: str, *, known_only: bool) -> tuple[pafs.FileSystem, str, list[str]]:
    """Resolve ``source`` to a filesystem, the prefix that turns its paths back into names, and the matching paths.

    Only the part before the first wildcard is handed to the filesystem,
    because remote stores list by prefix and know nothing of globs. Files whose
    name starts with "." or "_" are skipped when listing, as those are the
    markers and checksums (_SUCCESS, .crc) that distributed writers leave next to the data.
    A special file (FIFO, socket, device) is refused, not skipped: reading one would hang or never
    end, and skipping it would quietly load less than the folder seems to hold.
    """
    parts = source.split("/")
    wild = next((i for i, part in enumerate(parts) if "*" in part or "?" in part), len(parts))
    base, pattern = "/".join(parts[:wild]) or ("/" if source.startswith("/") else "."), "/".join(parts[wild:])
    if _URI.match(source):
        fs, root = _filesystem(base)
        prefix = base[: base.index("://") + 3]
    else:
        fs, root, prefix = pafs.LocalFileSystem(), os.path.abspath(base), ""
    if not pattern:
        info = _file_info(fs, root, source)
        if info.type == pafs.FileType.File:
            return fs, prefix, [root]
        _refuse_special(info, source)
        if info.type != pafs.FileType.Directory:
            return fs, prefix, []
    selector = pafs.FileSelector(root, recursive=not pattern or "/" in pattern or "**" in pattern, allow_not_found=True)
    try:
        listing = fs.get_file_info(selector)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"cannot list source '{source}': {e}") from e
    matches = _glob(pattern).match if pattern else None
    skip = len(root.rstrip("/")) + 1
    listing = [info for info in listing if not info.base_name.startswith((".", "_"))
               and (not matches or matches(info.path[skip:]))]
    for info in listing:
        _refuse_special(info, source)
    return fs, prefix, [
        info.path
        for info in listing
        if info.type == pafs.FileType.File
        and (matches or not known_only or _guess_format(info.path) is not None)
    ]


def _refuse_special(info: pafs.FileInfo, source: str) -> None:
    """A path that exists but is neither a file nor a folder: name it and what it is."""
    if info.type != pafs.FileType.Unknown:
        return
    try:
        mode = os.stat(info.path).st_mode
    except OSError:
        return  # gone meanwhile, or not local: nothing to read either way
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "not a regular file")
    raise SourceError(f"source '{source}': {info.path} is {kind}, not a data file; move it out of the source folder")


def _file_info(fs: pafs.FileSystem, path: str, source: str) -> pafs.FileInfo:
    try:
        return fs.get_file_info(path)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"cannot open source '{source}': {e}") from e


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """Honour an S3 endpoint override so that the same code runs against local S3 emulators."""
    endpoint = os.environ.get("TIMELAKE_S3_ENDPOINT")
    try:
        if endpoint and uri.startswith("s3://"):
            url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
            return pafs.S3FileSystem(endpoint_override=url.netloc, scheme=url.scheme), uri.removeprefix("s3://")
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"cannot open source '{uri}': {e}") from e


def _glob(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` stay within one directory level and ``**`` crosses levels, as in a shell."""
    regex = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(regex.get(t, re.escape(t)) for t in _GLOB_TOKEN.findall(pattern)) + r"\Z")


def _footer_bounds(fs: pafs.FileSystem, path: str, column: str) -> tuple[pa.DataType, int, int, int] | None:
    """``column``'s bounds from a Parquet file's footer (`layout.footer_bounds`). A footer that cannot be read
    tells nothing here: the scan reads that file and fails with its name."""
    try:
        with fs.open_input_file(path) as f:
            metadata = pq.read_metadata(f)
    except (pa.ArrowInvalid, OSError):
        return None
    return footer_bounds(metadata, column)


def _rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Cut and join reader output into batches of ``rows``.

    Readers yield by bytes or row groups; callers want a predictable memory
    footprint and few tiny batches. Batches of differing schemas (JSON chunks)
    are never joined.
    """
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if held and not batch.schema.equals(held[0].schema):
            yield _join(held)
            held, count = [], 0
        while batch.num_rows:
            take = min(rows - count, batch.num_rows)
            held.append(batch.slice(0, take))
            count += take
            batch = batch.slice(take)
            if count == rows:
                yield _join(held)
                held, count = [], 0
    if held:
        yield _join(held)


def _join(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _line_chunks(stream: pa.NativeFile, size: int, cut: Callable[[bytearray, int], int] | None = None,
                 blank: bool = False) -> Iterator[bytearray]:
    """Blocks of roughly ``size`` bytes that end on a line boundary, so that no JSON record is split.

    Each block is read straight into its own buffer behind the previous block's unfinished line and
    cut at its last newline: a block is copied once, by the read, and never joined or sliced. Blocks
    are allocated at one size (the unfinished line takes its room from the read): blocks of a few
    bytes more each time were each mapped afresh by the C allocator, and touching new pages was about
    half the reading (1M line-protocol points: 148 -> 134 ms CPU, median of 12).

    ``cut`` may move a block's end back from its last newline to an earlier line's start (given the
    block and the end after that newline). A block of only whitespace is left out unless ``blank``
    (a reader that numbers lines counts its newlines). ``_mapped_line_chunks`` cuts a mapped file alike.
    """
    rest = b""
    while True:
        block = bytearray(size if len(rest) < size // 2 else len(rest) + size)  # a longer line: room to grow
        block[:len(rest)] = rest
        got = stream.readinto(memoryview(block)[len(rest):])
        if not got:
            break
        end = len(rest) + got
        at = block.rfind(b"\n", 0, end) + 1
        if at and cut is not None:
            at = cut(block, at)
        rest = bytes(block[at:end]) if at else bytes(block[:end])
        if not at:
            continue
        del block[at:]
        if blank or not block.isspace():  # stops at the first byte that is not whitespace: no copy, unlike strip()
            yield block
    if rest and (blank or not rest.isspace()):
        yield bytearray(rest)


def _mapped_line_chunks(mapped: mmap.mmap, size: int,
                        cut: Callable[[memoryview, int], int] | None = None) -> Iterator[tuple[int, memoryview]]:
    """The blocks ``_line_chunks(stream, size, cut, blank=True)`` reads from the same file, as
    (offset, view) of a memory map: nothing is copied, and the pages are read by whoever reads the
    view, so the reading thread only finds where blocks end. The windows are those of the stream:
    ``size`` bytes from a block's start, or the unfinished line and ``size`` more when that line is at
    least half of ``size``."""
    whole = memoryview(mapped)
    start, end_of_file = 0, len(mapped)
    unfinished = 0  # bytes from start that the last window held
    while start + unfinished < end_of_file:
        window = min(start + (size if unfinished < size // 2 else unfinished + size), end_of_file)
        at = mapped.rfind(b"\n", start, window) + 1
        if at and cut is not None:
            at = start + cut(whole[start:window], at - start)
        if not at:
            unfinished = window - start
            continue
        yield start, whole[start:at]
        start, unfinished = at, window - at
    if start < end_of_file:
        yield start, whole[start:]
