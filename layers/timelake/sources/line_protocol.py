"""InfluxDB line protocol: export files parsed into Arrow a chunk of whole lines at a time.

Where the package was built with a C compiler, a chunk's plain lines are cut and typed in one pass
by ``_lineproto`` (see ``_lineproto.c``), and only the lines it sets aside take the paths below.
Otherwise a chunk is first cut at its spaces by Arrow's CSV reader (space as the delimiter, three
columns: series, field set, timestamp), and the field sets are cut at their commas by a second CSV
pass; separators inside quoted strings are masked first. Either way the distinct series of a
chunk, a few hundred in a typical export, are split into measurement and tags with Arrow kernels
and numbered for the whole file (``SERIES``), which the merge keys on. Lines this cannot read
exactly (escapes, comments, blank lines, another number of spaces, a field without ``=``) go, with
their line numbers, through the general split: Arrow kernels over the lines, and a per-line
tokenizer for lines with backslash escapes. Types come from each value's spelling (``1i``, ``1u``,
``t``, ``"…"``, else float), and a field spelled two ways is an error that names both lines.
Exports write one line per field of a point, so the lines of a point are merged into one row
(``points``) before the rows leave this module. The compiled reader already joins the lines of a
point that are a run apart within one series' lines, and chunks are cut between series, so the
merge of such an export only has to confirm that no point has two rows.
"""

from __future__ import annotations

import mmap
import re
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from timelake.sources.base import SourceError, _line_chunks, _mapped_line_chunks

try:
    from timelake.sources import _lineproto  # compiled at install (_lineproto.c)
except ImportError:  # no compiler where it was installed, or a build for another machine (a Lambda layer)
    _lineproto = None

TIME = "time"
LINE = "__line"
SERIES = "__series"  # a number per series of the file, from the compiled and CSV splits (not the general one)
BLOCK = "__block"  # true where a block of the compiled reader begins: rows up to the next are of one series, a time once
_SERIES_MOST = 4_096  # new series of a chunk numbered in Python; beyond, unless few per line, the merge hashes the tags
_SERIES_KEPT = 100_000  # series a file's parser remembers; past that, the merge hashes the tags
TIME_TYPE = pa.timestamp("ns", tz="UTC")
_NS_PER = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_CHUNK_BYTES = 8 << 20
_AHEAD = 2  # chunks split ahead of the one being checked
_ODD_LINES = 1_000  # lines of a chunk the general split takes beside the CSV reader before it takes the whole chunk
_HOLD_BYTES = 256 << 20  # lines held in memory for the merge; beyond, they are spilled to disk by time
_SPILL_PARTS = 16  # files a spill is cut into (by a hash of the time), and again for any still above _HOLD_BYTES
_MERGE_SLICES = 256  # runs of rows the merge passes on as they are; with more, every row goes through the sort
_TRUE = ["t", "T", "true", "True", "TRUE"]
_FALSE = ["f", "F", "false", "False", "FALSE"]
ARROW_TYPES = {"float": pa.float64(), "integer": pa.int64(), "unsigned": pa.uint64(), "string": pa.string(),
               "boolean": pa.bool_()}
_KINDS = ["float", "string", "integer", "unsigned", "boolean"]  # by the code _spellings gives each spelling
_DDL = ("CREATE DATABASE ", "CREATE RETENTION POLICY ")  # the DDL part of an export
_KEY = r"(?:[^,=\s\\]|\\.)+"
_MASK = {" ": "\x01", ",": "\x02", "=": "\x03"}
_MASK_BYTES = np.frombuffer(bytes.maketrans("".join(_MASK).encode(), "".join(_MASK.values()).encode()), np.uint8)
_SEPARATOR = _MASK_BYTES != np.arange(256)
_UNMASK = str.maketrans({code: char for char, code in _MASK.items()})
_UNMASK_BYTES = np.arange(256, dtype=np.uint8)
_UNMASK_BYTES[[ord(code) for code in _MASK.values()]] = [ord(char) for char in _MASK]
_SLOW_LINE = re.compile(
    rf"(?P<m>(?:[^,\s\\]|\\.)+)(?P<tags>(?:,{_KEY}=(?:[^,=\s\\]|\\.)*)*)"
    rf" (?P<fields>{_KEY}=(?:\"(?:[^\"\\]|\\.)*\"|[^,\s\"]+)(?:,{_KEY}=(?:\"(?:[^\"\\]|\\.)*\"|[^,\s\"]+))*)"
    r"(?: (?P<ts>-?\d+))?\Z"
)
_SLOW_PAIR = re.compile(rf"({_KEY})=(\"(?:[^\"\\]|\\.)*\"|(?:[^,\s\\]|\\.)*)")
_UNESCAPE = re.compile(r"\\([,= \"\\])")
_NOT_PLAIN = (b"\r", *(c.encode() for c in _MASK.values()))  # one byte each: memchr


class InfluxError(SourceError):
    """Line protocol that cannot be read, or a field whose type changes between points."""


Typed = tuple[dict[str, int], pa.Array | None, InfluxError | None]  # kind -> first line; the column; why it has none


@dataclass
class _Cells:
    """Field values the compiled reader typed, grouped by key; within a key, in file order.

    ``row`` is each cell's row among the lines the reader kept, ``value`` a double's bits, an integer,
    a boolean, or a string's offset in ``text`` (low 32 bits) and length (high 32 bits); ``kinds``
    has a bit per kind (numbered as in _KINDS) each key is spelled in, and ``first`` the file line
    where each key is first spelled in each kind (-1: never), exact where a cell joined an earlier
    line's row; it is only used when every row is kept. Where the reader joined lines to rows
    (``joined``), a key's cells may come out of row order (a row added for a time a block's first run
    lacks precedes a later line joining an earlier row): they are then placed by row.
    """

    counts: np.ndarray
    kinds: np.ndarray
    row: np.ndarray
    kind: np.ndarray
    value: np.ndarray
    text: np.ndarray
    first: np.ndarray
    joined: bool

    def column(self, key: int, at: np.ndarray | None, lines: np.ndarray) -> Typed:
        """The kinds one key is spelled in (kind -> first line) and, when spelled one way, its column.

        ``at`` is the row in ``lines`` of each row the reader kept (-1: not the job's), None when the same.
        """
        start = int(self.counts[:key].sum())
        end = start + int(self.counts[key])
        rows, kinds, values = self.row[start:end], self.kind[start:end], self.value[start:end]
        whole = True  # the key's cells of every line the reader kept: its strings are one run of ``text``
        if at is not None:
            rows = at[rows]
            keep = rows >= 0
            if not keep.all():
                rows, kinds, values, whole = rows[keep], kinds[keep], values[keep], False
        if not len(rows):
            return {}, None, None
        ordered = not self.joined or bool((rows[1:] > rows[:-1]).all())
        bits = int(self.kinds[key])
        if bits & (bits - 1) or at is None:  # spelled more than one way in the chunk; maybe in the job's lines too
            spelled = sorted((int(line), code) for code, line in enumerate(self.first[key]) if line >= 0) if at is None \
                else sorted((int(lines[rows[int(np.argmax(kinds == code))]]), code)
                            for code in np.flatnonzero(np.bincount(kinds, minlength=len(_KINDS))))
            if len(spelled) > 1:
                return {_KINDS[code]: line for line, code in spelled}, None, None
        kind, size = _KINDS[int(kinds[0])], len(lines)
        found = {kind: spelled[0][0] if at is None else int(lines[rows[0]])}
        if kind == "string":
            if not ordered:
                order = np.argsort(rows, kind="stable")
                rows, values, whole = rows[order], values[order], False
            return found, self._strings(values & np.uint64(0xFFFFFFFF), values >> np.uint64(32), rows, size, whole), None
        typed = {"float": values.view(np.float64), "integer": values.view(np.int64), "unsigned": values,
                 "boolean": values.astype(bool)}[kind]
        if len(rows) == size and ordered:  # a key at most once per row: then every row has it
            return found, pa.array(typed), None
        full = np.zeros(size, dtype=typed.dtype)
        full[rows] = typed
        missing = np.ones(size, dtype=bool)
        missing[rows] = False
        return found, pa.array(full, mask=missing), None

    def _strings(self, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray, size: int, whole: bool) -> pa.Array:
        """A string column (lines without the key are null): a run of ``text`` as it is, or gathered."""
        starts, lengths = starts.astype(np.int64), lengths.astype(np.int64)
        if len(rows) == size:
            sizes = lengths
        else:
            sizes = np.zeros(size, dtype=np.int64)
            sizes[rows] = lengths
        offsets = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        total = int(offsets[-1])
        if whole:
            data = pa.py_buffer(self.text[int(starts[0]):int(starts[0]) + total])
        else:
            data = pa.py_buffer(self.text[np.repeat(starts - offsets[rows], lengths) + np.arange(total)].tobytes())
        valid = None
        if len(rows) < size:
            present = np.zeros(size, dtype=bool)
            present[rows] = True
            valid = pa.py_buffer(np.packbits(present, bitorder="little").tobytes())
        return pa.StringArray.from_buffers(size, pa.py_buffer(offsets.astype(np.int32).tobytes()), data, valid,
                                           size - len(rows))


@dataclass
class _Parsed:
    """Lines of the general split as (row, key, raw text) triples, before columns are built."""

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
class _Split:
    """A chunk cut at its spaces by Arrow's CSV reader: series, field set and timestamp of each line.

    ``odd`` are the numbers of the lines that did not have exactly two spaces; ``text`` is the chunk as
    read (separators inside quotes masked), to take those lines from.
    """

    text: bytes | bytearray
    first_line: int
    lines: np.ndarray
    series: pa.Array
    fields: pa.Array
    time: pa.Array
    odd: np.ndarray
    masked: bool


@dataclass
class _Part:
    """Rows of the job's measurement from one chunk, each field typed by its own spelling.

    What must be checked against the rest of the file (a field's type, a key both tag and field) is
    checked in file order by ``LineProtocol._check``, so the errors a worker finds wait in
    ``time_error`` and ``cast_errors`` until the checks before them have passed.
    """

    lines: np.ndarray
    seen: set[str]
    tags: set[str] = field(default_factory=set)
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)  # field -> kind -> first line
    batch: pa.RecordBatch | None = None
    time_error: tuple[int, InfluxError] | None = None
    cast_errors: dict[str, InfluxError] = field(default_factory=dict)


class LineProtocol:
    """Parses chunks of one stream; remembers field kinds so a type change across chunks is caught too."""

    def __init__(self, measurement: str, precision: str, origin: str) -> None:
        self.measurement = measurement
        self.precision = precision
        self.origin = origin
        self.kinds: dict[str, tuple[str, int]] = {}
        self.tags: set[str] = set()
        self.seen: set[str] = set()
        self.series: dict[tuple[tuple[str, str], ...], int] = {}  # tag pairs -> number, for SERIES
        self._known: dict[str, tuple[str | None, dict[str, str], bool, int]] = {}  # series text -> _distinct's answer
        self._numbering = threading.Lock()

    def batches(self, stream: pa.NativeFile) -> Iterator[pa.RecordBatch]:
        """The points of the measurement, one row per line (with its line number in LINE)."""
        for parts in self._split(stream):
            self._check(parts, reading=True)
            yield from (part.batch for part in parts if part.batch is not None and part.batch.num_rows)

    def scan(self, stream: pa.NativeFile) -> pa.Schema:
        """Tags and typed fields of the whole stream; raises on a field's second type."""
        for parts in self._split(stream):
            self._check(parts, reading=False)
        return self.schema()

    def schema(self) -> pa.Schema:
        return pa.schema([(TIME, TIME_TYPE), *((t, pa.string()) for t in sorted(self.tags)),
                          *((f, ARROW_TYPES[k]) for f, (k, _) in sorted(self.kinds.items()))])

    def _check(self, parts: list[_Part], reading: bool) -> None:
        """The errors of one chunk in the order a reader meets them: a missing timestamp, then field by
        field a key that is also a tag, a second type (named by the first line of each), a bad value."""
        for part in parts:
            self.seen.update(part.seen)
        times = sorted((part.time_error for part in parts if part.time_error), key=lambda e: e[0])
        if reading and times:
            raise times[0][1]
        tags = set().union(*(part.tags for part in parts))
        kinds: dict[str, dict[str, int]] = {}
        for part in parts:
            for key, spelled in part.kinds.items():
                for kind, line in spelled.items():
                    known = kinds.setdefault(key, {})
                    known[kind] = min(known.get(kind, line), line)
        for key in sorted(kinds):
            if key in tags or key in self.tags:
                self._both(key)
            for kind, line in sorted(kinds[key].items(), key=lambda item: item[1]):
                known = self.kinds.setdefault(key, (kind, line))
                if known[0] != kind:
                    raise InfluxError(
                        f"field '{key}' of measurement '{self.measurement}' has two types in {self.origin}: "
                        f"{known[0]} at line {known[1]} and {kind} at line {line}"
                    )
            cast = next((part.cast_errors[key] for part in parts if key in part.cast_errors), None)
            if reading and cast is not None:
                raise cast
        for key in sorted(tags & set(self.kinds)):
            self._both(key)
        self.tags |= tags

    def _both(self, key: str) -> None:
        raise InfluxError(f"{self.origin}: '{key}' of measurement '{self.measurement}' is both a tag and a field")

    def _split(self, stream: pa.NativeFile | mmap.mmap) -> Iterator[list[_Part]]:
        """Chunks parsed and typed on threads (Arrow kernels release the GIL), in file order.

        Only parsing runs ahead, at most _AHEAD chunks: the checks stay in order, so the first line
        of each type, named when a type changes, is the first in the file. A memory-mapped file is
        cut into views that the threads read themselves, and each thread counts its chunk's lines, so
        the reading thread only finds where chunks end; the pages a chunk was read from are let go
        once it is parsed, so the map does not grow the process by the file's size.
        """
        if _lineproto is not None:
            _lineproto.hold_heap()
        mapped = stream if isinstance(stream, mmap.mmap) and _lineproto is not None else None
        chunks: Iterator[tuple[int, bytes | bytearray | memoryview]]
        if mapped is not None:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            chunks = _mapped_line_chunks(mapped, _CHUNK_BYTES, _series_tail)
        else:  # the Arrow reader's cut searches bytes: a map is read as a stream
            reader = pa.BufferReader(pa.py_buffer(stream)) if isinstance(stream, mmap.mmap) else stream
            chunks = ((0, chunk) for chunk in _line_chunks(reader, _CHUNK_BYTES, _series_tail, blank=True))
        with ThreadPoolExecutor(max_workers=_AHEAD, thread_name_prefix="line-protocol") as pool:
            pending: deque[tuple[int, Future]] = deque()
            first: Future[int] = Future()
            first.set_result(1)
            released = 0
            for start, chunk in chunks:
                if mapped is not None and mapped.size() < len(mapped):  # the pages past its end cannot be read
                    raise InfluxError(f"{self.origin} was cut short while it was read: {mapped.size():,} bytes "
                                      f"of {len(mapped):,}")
                following: Future[int] = Future()
                pending.append((start, pool.submit(self._numbered, chunk, first, following)))
                first = following
                if len(pending) > _AHEAD:
                    yield pending.popleft()[1].result()
                    if mapped is not None:  # pages wholly before the oldest chunk still being read
                        released = _release(mapped, released, pending[0][0])
            while pending:
                yield pending.popleft()[1].result()

    def _numbered(self, chunk: bytes | bytearray | memoryview, first: Future[int],
                  following: Future[int]) -> list[_Part]:
        """The chunk's parts, numbered from the line after the previous chunk's last.

        The compiled reader cuts the chunk first, which needs no numbers and counts its lines. The
        previous chunk was handed to the pool first, so it is being read on another thread (or is
        done) and soon tells this one where to start. An error is passed down the chain, so no thread
        waits on a chunk that failed.
        """
        try:
            cut = _lineproto.split(chunk, _ODD_LINES, True) if _lineproto is not None else None
            count = cut[0] if cut is not None else _newlines(chunk) + (len(chunk) > 0 and chunk[-1] != 10)
            line = first.result()
        except BaseException as e:
            following.set_exception(e)
            raise
        following.set_result(line + count)
        return self._parts(chunk, line, cut)

    def _parts(self, chunk: bytes | bytearray | memoryview, first_line: int, cut: tuple | None) -> list[_Part]:
        """The rows of the compiled reader's cut; without one (no compiled reader, or it set aside too
        many lines), of the Arrow reader."""
        native = self._native(chunk, first_line, cut) if cut is not None else None
        if native is not None:
            return native
        if isinstance(chunk, memoryview):  # a view of a mapped file: the Arrow paths search it as bytes
            chunk = chunk.tobytes()
        split = _plain(chunk, first_line)
        return self._from_split(split, chunk) if split is not None else [self._whole(chunk, first_line)]

    def _whole(self, chunk: bytes, first_line: int) -> _Part:
        lines = pc.list_flatten(pc.split_pattern(pa.array([chunk], pa.binary()), b"\n"))
        return self._general(lines, np.arange(first_line, first_line + len(lines)))

    # --- lines cut by the CSV reader -------------------------------------------------------------

    def _from_split(self, split: _Split, chunk: bytes) -> list[_Part]:
        """Rows of the split whose series and fields read exactly; every other line goes to the general split."""
        encoded = split.series  # read dictionary-encoded: each series once
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        measurement, tags, readable, numbers = self._distinct(encoded.dictionary, len(codes))
        ok = readable[codes] & _mask(split.time.is_valid())
        if _has_byte(split.fields, ord("\\")):  # escapes: the tokenizer reads those lines
            ok &= ~_mask(pc.match_substring(split.fields, "\\"))
        cells, fine = _field_cells(split.fields if ok.all() else split.fields.filter(pa.array(ok)))
        if not fine.all():
            cells = {key: values.filter(pa.array(fine)) for key, values in cells.items()}
            ok[np.flatnonzero(ok)[~fine]] = False
        odd = np.sort(np.concatenate([split.odd, split.lines[~ok]]))
        if len(odd) > _ODD_LINES:
            return [self._whole(chunk, split.first_line)]
        parts = [self._general(_lines_of(split.text, split.first_line, odd, split.masked), odd)] if len(odd) else []
        if not ok.any():
            return parts
        present = np.bincount(codes[ok], minlength=len(measurement)) > 0
        part = _Part(split.lines[ok], set(measurement.filter(pa.array(present)).to_pylist()))
        parts.insert(0, part)
        if self.measurement not in part.seen:
            return parts
        ours = _mask(pc.equal(measurement, self.measurement))[codes]
        wanted = ours[ok]
        mine = ok & ours
        tag_columns, series = _tag_columns(tags, codes[mine], numbers)
        if not wanted.all():
            cells = {key: values.filter(pa.array(wanted)) for key, values in cells.items()}
        fields = {key: values for key, values in cells.items() if values.null_count < len(values)}
        stamps = split.time if mine.all() else split.time.filter(pa.array(mine))
        lines = part.lines[wanted]
        self._fill(part, lines, stamps, tag_columns, self._typed_all(fields, lines, split.masked), series)
        return parts

    # --- lines cut by the compiled reader --------------------------------------------------------

    def _native(self, chunk: bytes | bytearray | memoryview, first_line: int, got: tuple,
                join: bool = True) -> list[_Part] | None:
        """Rows of the lines the compiled reader cut and typed (``got``, cut with ``join``); every other
        line goes to the general split.

        None when more than _ODD_LINES lines are set aside: then the CSV split, which reads some
        spellings the compiled reader leaves alone (``+1``, ``inf``), gets the chunk. Lines joined to
        an earlier line's row are read again unjoined when some rows are not kept (another
        measurement, a series for the general split): a row left out must leave out only its own line.
        """
        (_, odd, rows, codes, stamps, offsets, text, keys, counts, kinds, cell_row, cell_kind, cell_value, strings, first,
         joined, block) = got
        rows, codes = np.frombuffer(rows, np.int32), np.frombuffer(codes, np.int32)
        distinct = pa.StringArray.from_buffers(len(offsets) // 4 - 1, pa.py_buffer(offsets), pa.py_buffer(text))
        measurement, tags, readable, numbers = self._distinct(distinct, len(codes))
        every = bool(readable.all())  # the common chunk: every series read, so no row to select (a row per line)
        if joined and not (every and bool(pc.all(pc.equal(measurement, self.measurement)).as_py())):
            unjoined = _lineproto.split(chunk, _ODD_LINES, False)
            return self._native(chunk, first_line, unjoined, join=False) if unjoined is not None else None
        ok = None if every else readable[codes]
        odd = np.frombuffer(odd, np.int32)  # in line order, as the reader set them aside
        if ok is not None:
            odd = np.sort(np.concatenate([odd, rows[~ok]]))
        odd = odd.astype(np.int64) + first_line
        if len(odd) > _ODD_LINES:
            return None
        parts = [self._general(_lines_of(chunk, first_line, odd, masked=False), odd)] if len(odd) else []
        lines = rows.astype(np.int64) + first_line
        if ok is None:  # each series the reader numbered has a line it read
            part = _Part(lines, set(measurement.to_pylist()))
        else:
            present = np.bincount(codes[ok], minlength=len(measurement)) > 0
            part = _Part(lines[ok], set(measurement.filter(pa.array(present)).to_pylist()))
        if not len(part.lines):
            return parts
        parts.insert(0, part)
        if self.measurement not in part.seen:
            return parts
        ours = _mask(pc.equal(measurement, self.measurement))
        stamps, at, block = np.frombuffer(stamps, np.int64), None, np.frombuffer(block, np.bool_)
        if ok is not None or not ours.all():
            mine = ours[codes] if ok is None else ok & ours[codes]
            if not mine.all():  # whole series left out: whole blocks
                at = np.full(len(rows), -1, dtype=np.int64)
                at[mine] = np.arange(int(mine.sum()))
                codes, stamps, lines, block = codes[mine], stamps[mine], lines[mine], block[mine]
        tag_columns, series = _tag_columns(tags, codes, numbers)
        first = np.frombuffer(first, np.int64).reshape(-1, len(_KINDS))
        cells = _Cells(np.frombuffer(counts, np.int64), np.frombuffer(kinds, np.uint8), np.frombuffer(cell_row, np.int32),
                       np.frombuffer(cell_kind, np.uint8), np.frombuffer(cell_value, np.uint64), np.frombuffer(strings, np.uint8),
                       np.where(first >= 0, first + first_line, -1), joined > 0)
        typed = {key: cells.column(index, at, lines) for index, key in enumerate(keys)}
        stamps = pa.array(stamps)
        self._fill(part, lines, stamps, tag_columns, {key: t for key, t in typed.items() if t[0]}, series,
                   pa.array(block) if join else None)
        return parts

    # --- the general split -----------------------------------------------------------------------

    def _general(self, lines: pa.Array, numbers: np.ndarray) -> _Part:
        """Lines (binary) of any shape: comments, DDL and blank lines skipped, escapes honoured, bad lines named."""
        try:
            lines = pc.utf8_trim(lines.cast(pa.string()), "\r")
        except pa.ArrowInvalid as e:
            raise InfluxError(f"{self.origin} near line {numbers[0]} is not UTF-8 text: {e}") from e
        skip = pc.or_(pc.starts_with(lines, "#"), pc.or_(*(pc.starts_with(lines, ddl) for ddl in _DDL)))
        keep = pc.and_(pc.not_equal(lines, ""), pc.invert(skip))
        lines, numbers = lines.filter(keep), numbers[_mask(keep)]
        quoted = _mask(pc.match_substring(lines, '"'))
        tricky = _mask(pc.match_substring_regex(lines, "[\\\\\x01-\x03]"))
        if quoted.any():
            tricky |= _mask(pc.equal(pc.bit_wise_and(pc.count_substring(lines, '"'), 1), 1))
        simple = lines.filter(pa.array(~tricky))
        fast = self._fast(_mask_quoted(simple) if quoted.any() else simple, numbers[~tricky])
        slow = self._slow(lines.filter(pa.array(tricky)), numbers[tricky])
        return self._columns(fast, slow)

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

    def _columns(self, *parts: _Parsed) -> _Part:
        """Rows of the wanted measurement, fast and slow lines together in file order."""
        numbers = np.concatenate([p.lines for p in parts])
        measurement = pa.concat_arrays([p.measurement for p in parts])
        offsets = np.cumsum([0, *(len(p.lines) for p in parts)])
        groups = _groups(measurement)
        part = _Part(numbers, {key for key, _ in groups})
        wanted = next((pick for key, pick in groups if key == self.measurement), np.zeros(len(numbers), dtype=bool))
        if not wanted.any():
            return part
        order = np.argsort(numbers[wanted], kind="stable")
        position = np.full(len(numbers), -1, dtype=np.int64)
        position[np.flatnonzero(wanted)[order]] = np.arange(int(wanted.sum()))
        lines = numbers[wanted][order]
        stamps = pa.concat_arrays([p.time for p in parts]).take(pa.array(np.flatnonzero(wanted)[order]))

        def triples(kind: str) -> tuple[np.ndarray, pa.Array, pa.Array]:
            rows = np.concatenate([np.asarray(getattr(p, f"{kind}_rows"), dtype=np.int64) + off
                                   for p, off in zip(parts, offsets, strict=False)])
            keys = pa.concat_arrays([getattr(p, f"{kind}_keys") for p in parts])
            values = pa.concat_arrays([getattr(p, f"{kind}_values") for p in parts])
            at = position[rows] if len(rows) else rows
            mine = at >= 0
            return at[mine], keys.filter(pa.array(mine)), values.filter(pa.array(mine))

        at, keys, values = triples("tag")
        tags = {key: _scatter(at[pick], values.filter(pa.array(pick)), len(lines)) for key, pick in _groups(keys)}
        at, keys, values = triples("field")
        fields = {key: _scatter(at[pick], values.filter(pa.array(pick)), len(lines)) for key, pick in _groups(keys)}
        self._fill(part, lines, stamps, tags, self._typed_all(fields, lines, masked=True))
        return part

    # --- typing ----------------------------------------------------------------------------------

    def _fill(self, part: _Part, lines: np.ndarray, stamps: pa.Array, tags: dict[str, pa.Array],
              fields: dict[str, Typed], series: pa.Array | None = None, block: pa.Array | None = None) -> None:
        """The part's batch: time, line numbers, tags, and each field typed by its spelling (all or nothing)."""
        part.tags = set(tags)
        time = self._time(stamps, lines, part)
        columns: dict[str, pa.Array] = {TIME: time, LINE: pa.array(lines, pa.int64()), **dict(sorted(tags.items()))}
        if series is not None:
            columns[SERIES] = series
        if block is not None:
            columns[BLOCK] = block
        for key, (kinds, typed, error) in sorted(fields.items(), key=lambda item: item[0]):
            part.kinds[key] = kinds
            if error is not None:
                part.cast_errors[key] = error
            if typed is not None:
                columns[key] = typed
        if time is not None:
            part.batch = pa.RecordBatch.from_pydict(columns)

    def _distinct(self, distinct: pa.Array,
                  rows: int) -> tuple[pa.Array, dict[str, pa.Array], np.ndarray, np.ndarray | None]:
        """What ``_series`` says of each distinct series text of a chunk, and each series' number for the
        whole file (None when too many are new to number here: then the merge hashes the tags).

        Texts seen in an earlier chunk are answered from memory: an export repeats its few hundred
        series in every chunk, and splitting and numbering them again cost a tenth of the reading.
        """
        texts = distinct.to_pylist()
        new = [i for i, text in enumerate(texts) if text not in self._known]
        if len(new) > _SERIES_MOST and len(new) * 8 > rows or len(self.series) + len(new) > _SERIES_KEPT:
            measurement, tags, readable = _series(distinct)
            return measurement, tags, readable, None
        if new:
            measurement, tags, readable = _series(distinct.take(pa.array(new, pa.int64())))
            names, values = measurement.to_pylist(), {key: column.to_pylist() for key, column in tags.items()}
            with self._numbering:
                for j, i in enumerate(new):
                    pairs = {key: column[j] for key, column in sorted(values.items()) if column[j] is not None}
                    number = self.series.setdefault(tuple(pairs.items()), len(self.series))
                    self._known[texts[i]] = (names[j], pairs, bool(readable[j]), number)
        known = [self._known[text] for text in texts]
        keys = sorted({key for _, pairs, _, _ in known for key in pairs})
        return (pa.array([name for name, *_ in known], pa.string()),
                {key: pa.array([pairs.get(key) for _, pairs, _, _ in known], pa.string()) for key in keys},
                np.fromiter((readable for _, _, readable, _ in known), bool, len(known)),
                np.fromiter((number for *_, number in known), np.int64, len(known)))

    def _typed_all(self, fields: dict[str, pa.Array], lines: np.ndarray, masked: bool) -> dict[str, Typed]:
        return {key: self._typed(key, raw, lines, masked) for key, raw in fields.items()}

    def _time(self, stamps: pa.Array, lines: np.ndarray, part: _Part) -> pa.Array | None:
        """The times in ns; else the part's first timestamp error by line, whichever kind it is, so
        that the error named does not depend on where the file was cut into chunks."""
        missing = np.flatnonzero(_mask(stamps.is_null()))
        if len(missing):
            line = int(lines[missing[0]])
            part.time_error = (line, InfluxError(f"line {line} of {self.origin} has no timestamp (an export always has one)"))
        try:
            ns = stamps.cast(pa.int64())
            if _NS_PER[self.precision] != 1:
                ns = pc.multiply_checked(ns, _NS_PER[self.precision])
        except pa.ArrowInvalid:
            present = _mask(stamps.is_valid())
            line, text = _first_bad_stamp(stamps.filter(pa.array(present)), lines[present], _NS_PER[self.precision])
            if part.time_error is None or line < part.time_error[0]:
                part.time_error = (line, InfluxError(
                    f"line {line} of {self.origin}: timestamp {text!r} is not an integer number of {self.precision} "
                    "that fits 64-bit nanoseconds"))
            return None
        return None if part.time_error else ns.cast(TIME_TYPE)

    def _typed(self, key: str, raw: pa.Array, lines: np.ndarray, masked: bool) -> Typed:
        """The kinds a field is spelled in (kind -> first line) and, when it is spelled one way, its typed values.

        The first value's spelling is checked over all values with one kernel (a float needs none:
        only floats cast), so a field of one type costs one pass; any other field gets a code per value.
        """
        first = int(np.argmax(_mask(raw.is_valid())))
        kind = _spelling(raw[first].as_py())
        if kind == "float":
            try:
                return {kind: int(lines[first])}, raw.cast(pa.float64()), None
            except pa.ArrowInvalid:
                pass
        elif _all(_spelled_as(raw.drop_null() if raw.null_count else raw, kind)):
            return {kind: int(lines[first])}, *self._cast(key, kind, raw, masked)
        spelled = _spellings(raw, lines)
        if len(spelled) > 1:
            return spelled, None, None
        return spelled, *self._cast(key, next(iter(spelled)), raw, masked)

    def _cast(self, key: str, kind: str, raw: pa.Array, masked: bool) -> tuple[pa.Array | None, InfluxError | None]:
        if kind == "string":
            inner = pc.utf8_slice_codeunits(raw, 1, -1)
            inner = _unmask(inner) if masked else inner
            if _has_byte(inner, ord("\\")):
                inner = pc.replace_substring(pc.replace_substring(inner, '\\"', '"'), "\\\\", "\\")
            return inner, None
        if kind == "boolean":
            true = pc.is_in(raw, pa.array(_TRUE))
            return (pc.if_else(raw.is_valid(), true, pa.scalar(None, pa.bool_())) if raw.null_count else true), None
        if kind in ("integer", "unsigned"):
            raw = pc.utf8_slice_codeunits(raw, 0, -1)
        try:
            return raw.cast(ARROW_TYPES[kind]), None
        except pa.ArrowInvalid as e:
            return None, InfluxError(f"field '{key}' of measurement '{self.measurement}' in {self.origin} "
                                     f"has a value that is not a {kind}: {e}")

    def _malformed(self, line: int, text: str) -> None:
        raise InfluxError(f"line {line} of {self.origin} is not line protocol: {text.translate(_UNMASK)[:80]!r}")


def _plain(chunk: bytes, first_line: int) -> _Split | None:
    """The chunk cut at its spaces by Arrow's CSV reader; None when most of it needs the general split.

    Separators inside double quotes are masked first (without backslashes the quotes of a line pair
    up), so a quoted string with spaces, commas or equal signs is one cell. Up to _ODD_LINES lines of
    another shape (comments, headers, escaped spaces, a missing timestamp) are set aside by number.
    """
    if any(mark in chunk for mark in _NOT_PLAIN):
        return None
    total = chunk.count(b"\n") + (not chunk.endswith(b"\n"))
    masked = b'"' in chunk
    if masked:
        chunk = _mask_quotes(chunk)
        if chunk is None:
            return None
    odd: list[int] = []

    def set_aside(row: pcsv.InvalidRow) -> str:
        odd.append(row.number)
        return "skip" if len(odd) <= _ODD_LINES and row.number is not None else "error"

    try:
        table = pcsv.read_csv(
            pa.BufferReader(chunk),
            pcsv.ReadOptions(column_names=["s", "f", "t"], block_size=len(chunk) + 1, use_threads=False),
            pcsv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False, double_quote=False,
                              newlines_in_values=False, ignore_empty_lines=True, invalid_row_handler=set_aside),
            pcsv.ConvertOptions(column_types={"s": pa.dictionary(pa.int32(), pa.string()), "f": pa.string(), "t": pa.int64()},
                                strings_can_be_null=False))
    except pa.ArrowInvalid:  # too many odd lines, a timestamp that is no integer, or not UTF-8
        return None
    if table.num_rows + len(odd) != total:  # blank lines, which the reader drops without a number
        return None
    odd_lines = np.asarray(odd, dtype=np.int64) + (first_line - 1)
    lines = np.delete(np.arange(first_line, first_line + total), odd_lines - first_line)
    return _Split(chunk, first_line, lines, *(table.column(c).combine_chunks() for c in "sft"), odd_lines, masked)


def _mask_quotes(chunk: bytes) -> bytearray | None:
    """The chunk with spaces, commas and equal signs between each pair of quotes masked; None when a
    line has an odd number of quotes. Touches only the bytes inside quotes, not the whole chunk."""
    text = bytearray(chunk)
    view = np.frombuffer(text, np.uint8)
    quotes = np.flatnonzero(view == ord('"'))
    if len(quotes) % 2:
        return None
    opens, closes = quotes[0::2], quotes[1::2]
    sizes = closes - opens - 1
    inside = np.arange(int(sizes.sum())) + np.repeat(opens + 1 - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    quoted = view[inside]
    if (quoted == ord("\n")).any():
        return None  # a pair of quotes across lines: some line has an odd number
    found = inside[_SEPARATOR[quoted]]
    view[found] = _MASK_BYTES[view[found]]
    return text


def _series(distinct: pa.Array) -> tuple[pa.Array, dict[str, pa.Array], np.ndarray]:
    """Measurement, tags (key -> value per distinct series) and whether each series reads exactly.

    A series with a backslash, a masked separator (a quote) or a tag without ``=``, or one that is
    a comment, is left to the general split, which reads or names it.
    """
    parts = pc.split_pattern(distinct, ",")
    measurement = pc.list_element(parts, 0)
    readable = ~_mask(pc.or_(pc.match_substring_regex(distinct, r"[\\\x01-\x03]"), pc.starts_with(distinct, "#")))
    readable &= _mask(pc.not_equal(measurement, ""))
    tags = pc.list_slice(parts, 1)
    rows = np.asarray(pc.list_parent_indices(tags))
    pairs = pc.split_pattern(pc.list_flatten(tags), "=", max_splits=1)
    whole = pc.list_value_length(pairs).to_numpy(zero_copy_only=False) == 2
    readable[rows[~whole]] = False
    pairs, rows = pairs.filter(pa.array(whole)), rows[whole]
    keys, values = pc.list_element(pairs, 0), pc.list_element(pairs, 1)
    return measurement, {key: _scatter(rows[at], values.filter(pa.array(at)), len(distinct))
                         for key, at in _groups(keys)}, readable


def _tag_columns(tags: dict[str, pa.Array], codes: np.ndarray,
                 numbers: np.ndarray | None) -> tuple[dict[str, pa.Array], pa.Array | None]:
    """Tag columns of the rows of series ``codes``, from each tag's value per distinct series, and
    each row's series number (for the merge, which then hashes no tag strings)."""
    columns = {key: column for key, column in ((key, values.take(pa.array(codes))) for key, values in tags.items())
               if column.null_count < len(column)}
    return columns, (pa.array(numbers[codes]) if numbers is not None else None)


def _field_cells(fields: pa.Array, depth: int = 0) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Field sets cut at their commas into ``key -> raw value`` columns (null where a line lacks the key),
    and which lines were cut exactly (every part ``key=value``): only those lines' values count.

    Lines with another number of fields than the first are cut by a pass of their own, a few deep.
    """
    fine = np.ones(len(fields), dtype=bool)
    if not len(fields):
        return {}, fine
    other = np.zeros(len(fields), dtype=bool)
    if not _has_byte(fields, ord(",")):
        cells = [fields]
    else:
        def set_aside(row: pcsv.InvalidRow) -> str:
            other[row.number - 1] = True
            return "skip"

        joined = pc.binary_join_element_wise(fields, "", "\n").buffers()[2]
        width = fields[0].as_py().count(",") + 1
        names = [str(i) for i in range(width)]
        table = pcsv.read_csv(
            pa.BufferReader(joined), pcsv.ReadOptions(column_names=names, block_size=joined.size + 1, use_threads=False),
            pcsv.ParseOptions(delimiter=",", quote_char=False, escape_char=False, double_quote=False,
                              newlines_in_values=False, ignore_empty_lines=False, invalid_row_handler=set_aside),
            pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False))
        cells = [table.column(i).combine_chunks() for i in range(width)]
    rows = np.flatnonzero(~other)
    columns: dict[str, pa.Array] = {}
    for cell in cells:
        found, left = _keyed_runs(cell)
        if left.any():  # many keys in one column: split every remaining part at its first equal sign
            pairs = pc.split_pattern(cell.filter(pa.array(left)), "=", max_splits=1)
            whole = pc.list_value_length(pairs).to_numpy(zero_copy_only=False) == 2
            fine[rows[np.flatnonzero(left)[~whole]]] = False
            pairs, at = pairs.filter(pa.array(whole)), np.flatnonzero(left)[whole]
            keys, values = pc.list_element(pairs, 0), pc.list_element(pairs, 1)
            for key, pick in _groups(keys):
                more = _scatter(at[pick], values.filter(pa.array(pick)), len(cell))
                found[key] = pc.coalesce(found[key], more) if key in found else more
        for key, values in found.items():
            values = _widen(values, rows, len(fields))
            columns[key] = pc.coalesce(values, columns[key]) if key in columns else values  # a later pair wins
    if other.any():
        at = np.flatnonzero(other)
        if depth < 3:
            more, fine[at] = _field_cells(fields.filter(pa.array(other)), depth + 1)
            for key, values in more.items():
                values = _widen(values, at, len(fields))
                columns[key] = pc.coalesce(columns[key], values) if key in columns else values  # disjoint rows
        else:
            fine[at] = False
    return columns, fine


def _first_bad_stamp(stamps: pa.Array, lines: np.ndarray, scale: int) -> tuple[int, str]:
    """The line and text of the first timestamp that is no integer, or whose nanoseconds do not fit 64 bits."""
    if pa.types.is_integer(stamps.type):
        ns = stamps.to_numpy()
    else:
        integer = _mask(pc.match_substring_regex(stamps, r"^[+-]?[0-9]+$"))
        if not integer.all():
            at = int(np.argmin(integer))
            return int(lines[at]), str(stamps[at].as_py())
        ns = np.asarray([int(s) for s in stamps.to_pylist()], dtype=object)
    too_large = np.abs(ns) > (2**63 - 1) // scale
    at = int(np.argmax(too_large)) if too_large.any() else int(np.argmin(lines))
    return int(lines[at]), str(stamps[at].as_py())


def _keyed_runs(cell: pa.Array, most: int = 8) -> tuple[dict[str, pa.Array], np.ndarray]:
    """``key=value`` parts split by their key: up to ``most`` keys, each found with one prefix test over
    the column (an export's chunk holds runs of one or two fields); the parts left over, and those
    without an equal sign, are flagged for the caller."""
    found: dict[str, pa.Array] = {}
    left = np.ones(len(cell), dtype=bool)
    for _ in range(most):
        if not left.any():
            break
        key, equal, _ = cell[int(np.argmax(left))].as_py().partition("=")
        if not equal:
            break
        mine = _mask(pc.starts_with(cell, key + "=")) & left
        if mine.all():
            found[key] = pc.utf8_slice_codeunits(cell, len(key) + 1)
        else:
            at = np.flatnonzero(mine)
            found[key] = _scatter(at, pc.utf8_slice_codeunits(cell.filter(pa.array(mine)), len(key) + 1), len(cell))
        left &= ~mine
    return found, left


def _has_byte(strings: pa.Array, byte: int) -> bool:
    """Whether any value holds the byte: one compare over the values' bytes, not a kernel per value."""
    data = strings.buffers()[2]
    if data is None:
        return False
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset:strings.offset + len(strings) + 1]
    return bool((np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] == byte).any())


def _widen(values: pa.Array, rows: np.ndarray, size: int) -> pa.Array:
    """Values of ``rows`` (of ``size`` rows) placed at those rows."""
    if len(rows) == size:
        return values
    return _scatter(rows, values, size)


def _lines_of(chunk: bytes | bytearray, first_line: int, numbers: np.ndarray, masked: bool) -> pa.Array:
    """The text of some lines of a chunk (binary, separators unmasked when ``masked``), by line number."""
    text = np.frombuffer(chunk, np.uint8)
    ends = np.flatnonzero(text == ord("\n"))
    starts = np.concatenate([[0], ends + 1])
    ends = np.concatenate([ends, [len(text)]])
    at = numbers - first_line
    lines = [bytes(chunk[starts[i]:ends[i]]) for i in at]
    if masked:
        lines = [line.translate(_UNMASK_BYTES.tobytes()) for line in lines]
    return pa.array(lines, pa.binary())


def _spelling(value: str) -> str:
    """The kind a value is spelled as; the same rule as _spellings, for one value."""
    if value.startswith('"'):
        return "string"
    if value.endswith("i"):
        return "integer"
    if value.endswith("u"):
        return "unsigned"
    return "boolean" if value in _TRUE or value in _FALSE else "float"


def _spelled_as(raw: pa.Array, kind: str) -> pa.Array:
    if kind == "string":
        return pc.starts_with(raw, '"')
    if kind == "boolean":
        return pc.is_in(raw, pa.array(_TRUE + _FALSE))
    return pc.and_not(pc.ends_with(raw, "i" if kind == "integer" else "u"), pc.starts_with(raw, '"'))


def _spellings(raw: pa.Array, lines: np.ndarray) -> dict[str, int]:
    """Each kind the field is spelled in, with its first line, in file order (nulls are lines without the field)."""
    valid = _mask(raw.is_valid())
    raw, lines = raw.filter(pa.array(valid)), lines[valid]
    spelled = [_mask(m) for m in (pc.starts_with(raw, '"'), pc.ends_with(raw, "i"), pc.ends_with(raw, "u"),
                                  pc.is_in(raw, pa.array(_TRUE + _FALSE)))]
    codes = np.select(spelled, [1, 2, 3, 4], 0).astype(np.int8)  # integer codes: a unique of strings is slow
    firsts = sorted(int(np.argmax(codes == code)) for code in np.flatnonzero(np.bincount(codes, minlength=5)))
    return {_KINDS[codes[first]]: int(lines[first]) for first in firsts}


def _all(values: pa.Array) -> bool:
    return bool(pc.all(values).as_py())


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
    """Masked separators back to themselves: one table lookup over the values' bytes (offsets kept)."""
    validity, offsets, data = values.buffers()
    if data is None or not any(_has_byte(values, ord(code)) for code in _MASK.values()):
        return values
    plain = pa.py_buffer(_UNMASK_BYTES[np.frombuffer(data, np.uint8)])
    return pa.StringArray.from_buffers(len(values), offsets, plain, validity, values.null_count, values.offset)


def _series_tail(block: bytearray | memoryview, end: int) -> int:
    """Where the lines at the end of ``block[:end]`` of the last line's series begin, when that is in
    the second half; else ``end`` (which follows a newline). Chunks cut there keep a series' run of
    lines whole, where the compiled reader joins its lines of one point; the Arrow reader cuts the
    same way, so both read a file in the same chunks and name the same first error. (A view of a
    mapped file comes only with the compiled reader: the Arrow reader's cut searches bytes.)"""
    if _lineproto is not None:
        return _lineproto.series_tail(block, end)
    start = block.rfind(b"\n", 0, end - 1) + 1
    space = block.find(b" ", start, end - 1)
    if space < 0 or start <= end // 2:
        return end
    series = np.frombuffer(block, np.uint8, space + 1 - start, start)
    view = np.frombuffer(block, np.uint8, end)
    later = np.flatnonzero(view[end // 2:start - 1] == 10) + end // 2 + 1  # line starts past the half, but the last
    first = int(later[0]) if len(later) else start
    starts = np.concatenate([[block.rfind(b"\n", 0, first - 1) + 1], later, [start]])
    long = np.diff(np.append(starts, end)) - 1 > len(series)
    same = long.copy()
    for i, byte in enumerate(series):
        same[long] &= view[starts[long] + i] == byte
    differ = np.flatnonzero(~same[:-1])
    return int(starts[differ[-1] + 1]) if len(differ) else end


def _release(mapped: mmap.mmap, released: int, end: int) -> int:
    """Let go of the mapped pages from ``released`` up to the page that holds ``end``; the new mark."""
    end -= end % mmap.PAGESIZE
    if end > released:
        mapped.madvise(mmap.MADV_DONTNEED, released, end - released)
    return max(end, released)


def _newlines(chunk: bytes | bytearray | memoryview) -> int:
    """Newline bytes of a chunk: counted by the compiled reader when there is one (no temporary array)."""
    if _lineproto is not None:
        return _lineproto.newlines(chunk)
    return int(np.count_nonzero(np.frombuffer(chunk, np.uint8) == 10))


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
    file, so the merge waits for the whole file. Up to _HOLD_BYTES of lines are held in memory;
    beyond, every line is spilled to disk into one of _SPILL_PARTS files by a hash of its time (the
    lines of a point share their time), and each file is merged on its own. Nothing is sorted when
    no point has two lines and the lines come in time or series order.
    """
    held = _Held(0)
    try:
        for batch in lines:
            held.add(batch)
        schema = parser.schema()  # every tag and field of the file: each part of a spill has only its own
        for table in held.merged(sorted(parser.tags)):
            columns = [table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                       for f in schema]
            yield from pa.table(columns, schema=schema).to_batches(max_chunksize=batch_rows)
    finally:
        held.close()


class _Held:
    """Lines kept for the merge: a list of batches, or, past _HOLD_BYTES, files of a temporary folder."""

    def __init__(self, level: int) -> None:
        self.level = level  # how many times these lines were cut by their time already
        self.batches: list[pa.RecordBatch] = []
        self.nbytes = 0
        self.folder: tempfile.TemporaryDirectory | None = None
        self.writers: list[pa.ipc.RecordBatchStreamWriter | None] = []
        self.files: list[list[Path]] = []
        self.schema = pa.schema([])

    def add(self, batch: pa.RecordBatch) -> None:
        if self.folder is None:
            self.batches.append(batch)
            self.nbytes += batch.nbytes
            if self.nbytes > _HOLD_BYTES:
                self.folder = tempfile.TemporaryDirectory(prefix="timelake-influx-")
                self.writers, self.files = [None] * _SPILL_PARTS, [[] for _ in range(_SPILL_PARTS)]
                held, self.batches = self.batches, []
                for each in held:
                    self._spill(each)
            return
        self._spill(batch)

    def _spill(self, batch: pa.RecordBatch) -> None:
        """The batch cut by a hash of its time into the part files, all written with the widest schema so far."""
        if BLOCK in batch.schema.names:  # cut by time into parts, a block no longer holds its rows together
            batch = batch.drop_columns([BLOCK])
        grown = pa.unify_schemas([self.schema, batch.schema])
        if not grown.equals(self.schema):
            self.schema = grown
            self._close_writers()
        batch = pa.RecordBatch.from_arrays(
            [batch.column(f.name) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
             for f in self.schema], schema=self.schema)
        part = _time_hash(batch.column(0), self.level)
        order = np.argsort(part, kind="stable")
        counts = np.bincount(part, minlength=_SPILL_PARTS)
        batch = batch.take(pa.array(order))
        start = 0
        for index, count in enumerate(counts):
            if count:
                if self.writers[index] is None:
                    path = Path(self.folder.name) / f"{index}-{len(self.files[index])}.arrow"
                    self.files[index].append(path)
                    self.writers[index] = pa.ipc.new_stream(str(path), self.schema)
                self.writers[index].write_batch(batch.slice(start, count))
            start += count

    def merged(self, tags: list[str]) -> Iterator[pa.Table]:
        """The merged rows, one table per part when spilled (a part still too large is cut again)."""
        if self.folder is None:
            if self.batches:
                yield from _merge(self.batches, tags)
            return
        self._close_writers()
        for paths in self.files:
            if sum(path.stat().st_size for path in paths) <= _HOLD_BYTES or self.level >= 3:
                batches = [b for path in paths for b in pa.ipc.open_stream(pa.memory_map(str(path))).read_all().to_batches()]
                if batches:
                    yield from _merge(batches, tags)
            else:
                part = _Held(self.level + 1)
                try:
                    for path in paths:
                        for batch in pa.ipc.open_stream(pa.memory_map(str(path))):
                            part.add(batch)
                    yield from part.merged(tags)
                finally:
                    part.close()
            for path in paths:
                path.unlink()

    def _close_writers(self) -> None:
        for writer in self.writers:
            if writer is not None:
                writer.close()
        self.writers = [None] * len(self.writers)

    def close(self) -> None:
        self._close_writers()
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None


def _time_hash(time: pa.Array, level: int) -> np.ndarray:
    """Which of _SPILL_PARTS parts each time goes to; each level uses other bits of one multiplicative hash."""
    ns = time.cast(pa.int64()).to_numpy().view(np.uint64)
    mixed = ns * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(60 - 4 * level)) & np.uint64(_SPILL_PARTS - 1)).astype(np.int64)


def _merge(batches: list[pa.RecordBatch], tags: list[str]) -> list[pa.Table]:
    """One row per (series, time), a field's value from the last line (by LINE) that has it.

    Only the rows of series whose runs of rising time overlap are sorted: in an export whose reader
    joined each point's lines, that is the few series cut by a chunk's end, or none. The other rows
    are passed on as slices of the lines, not copied.
    """
    table = pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="default")
    time = table.column(TIME).cast(pa.int64()).to_numpy()
    if (np.diff(time) > 0).all():
        return [table]  # each time once: no point has two lines
    numbered = SERIES in table.column_names and table.column(SERIES).null_count == 0
    series, span = ((table.column(SERIES).to_numpy(), int(pc.max(table.column(SERIES)).as_py()) + 1) if numbered
                    else _series_codes(table, tags))
    block = table.column(BLOCK) if BLOCK in table.column_names else None
    overlap = _overlapping(series, time, None if block is None else (_mask(block.is_valid()), _mask(block.fill_null(False))))
    if overlap is None or overlap.sum() > len(overlap) // 2:
        return [_sorted_merge(table, series, span, time, tags)]
    edges = np.flatnonzero(overlap[1:] != overlap[:-1]) + 1
    if len(edges) > _MERGE_SLICES:
        return [_sorted_merge(table, series, span, time, tags)]
    bounds = [0, *edges.tolist(), len(overlap)]
    kept = [table.slice(start, end - start) for start, end in pairwise(bounds) if not overlap[start]]
    if not overlap.any():
        return kept
    return [*kept, _sorted_merge(table.filter(pa.array(overlap)), series[overlap], span, time[overlap], tags)]


def _overlapping(series: np.ndarray, time: np.ndarray,
                 block: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray | None:
    """Which rows are of a series with two runs that overlap in time: only those can hold a point twice.
    A run is a block of the compiled reader (``block``: which rows it read, and where a block begins),
    else rows of one series in rising time. None, to sort all, when runs are many and short."""
    cut = (series[1:] != series[:-1]) | (time[1:] <= time[:-1])
    if block is not None:  # a row of the reader's begins a run where its block does; another, where time falls
        read, begins = block
        cut = (series[1:] != series[:-1]) | np.where(read[1:], begins[1:], cut | read[:-1])
    starts = np.flatnonzero(cut) + 1
    if len(starts) > len(series) // 16:
        return None
    starts = np.concatenate([[0], starts])
    ends = np.concatenate([starts[1:], [len(series)]])
    low, high = np.minimum.reduceat(time, starts), np.maximum.reduceat(time, starts)
    order = np.lexsort((low, series[starts]))
    run_series, low, high = series[starts][order], low[order], high[order]
    # sorted by start, a series' runs overlap somewhere exactly when two consecutive ones do
    clash = (run_series[1:] == run_series[:-1]) & (low[1:] <= high[:-1])
    if not clash.any():
        return np.zeros(len(series), dtype=bool)
    first = np.flatnonzero(np.concatenate([[True], run_series[1:] != run_series[:-1]]))  # each series' first run
    bad = np.logical_or.reduceat(np.append(clash, False), first)  # per series
    run_bad = np.empty(len(order), dtype=bool)
    run_bad[order] = np.repeat(bad, np.diff(np.append(first, len(order))))
    return np.repeat(run_bad, ends - starts)


def _sorted_merge(table: pa.Table, series: np.ndarray, span: int, time: np.ndarray, tags: list[str]) -> pa.Table:
    """The merge by a sort on (series, time), then the last line of each field per point."""
    since = time - time.min()
    step = int(np.gcd.reduce(since)) or 1
    ticks = since // step
    width = int(ticks.max()) + 1
    if span * width < 2**62:
        keys = (ticks * span + series, series * width + ticks)  # time-major, series-major
        falls = [int(np.count_nonzero(np.diff(key) <= 0)) for key in keys]
        if min(falls) == 0:
            return table  # strictly increasing: no point has two lines
        key = keys[int(np.argmin(falls))]  # the nearer to sorted: the sort merges fewer, longer runs
        if min(falls) > len(key) // 64 and len(pc.unique(pa.array(key))) == len(key):
            return table  # far from sorted: one hash pass is cheaper than the sort
        line = table.column(LINE).to_numpy()
        order = np.argsort(key, kind="stable") if (np.diff(line) > 0).all() else np.lexsort((line, key))
        key = key[order]
        first = np.concatenate([[True], key[1:] != key[:-1]])
    else:
        order = np.lexsort((table.column(LINE).to_numpy(), ticks, series))
        series, ticks = series[order], ticks[order]
        first = np.concatenate([[True], (series[1:] != series[:-1]) | (ticks[1:] != ticks[:-1])])
    if first.all():
        return table
    starts = np.flatnonzero(first)
    keys = pa.array(order[starts])
    columns = {name: table.column(name).take(keys) for name in (TIME, *(t for t in tags if t in table.column_names))}
    point = np.cumsum(first) - 1  # the point of each line, in sorted order
    for name in table.column_names:
        if name in columns or name in (LINE, SERIES, BLOCK):
            continue
        at = np.flatnonzero(_mask(table.column(name).is_valid())[order])  # sorted lines that have the field
        owner = point[at]
        last = np.ones(len(at), dtype=bool)  # the last of a point's lines with the field wins
        last[:-1] = owner[1:] != owner[:-1]
        pick = np.full(len(starts), -1, dtype=np.int64)
        pick[owner[last]] = order[at[last]]
        columns[name] = table.column(name).take(pa.array(pick, mask=pick < 0))
    return pa.table(columns)


def _series_codes(table: pa.Table, tags: list[str]) -> tuple[np.ndarray, int]:
    """A number per row that is the same exactly when the rows' tags are (a missing tag counts), and the
    count of numbers it may take."""
    code = np.zeros(table.num_rows, dtype=np.int64)
    span = 1
    for tag in tags:
        if tag not in table.column_names:
            continue
        encoded = pc.dictionary_encode(table.column(tag)).combine_chunks()
        values = encoded.indices.fill_null(-1).to_numpy().astype(np.int64) + 1
        size = len(encoded.dictionary) + 1
        if span * size >= 2**62:
            dense = pc.dictionary_encode(pa.array(code))
            code, span = dense.indices.to_numpy().astype(np.int64), len(dense.dictionary)
        code, span = code * size + values, span * size
    return code, span
