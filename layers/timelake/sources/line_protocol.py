"""InfluxDB line protocol: export files parsed into Arrow a chunk of whole lines at a time.

What a file means is what influxd makes of it when the file is written to it a line at a time
(``lp_grammar`` is that parser, ported): the same lines refused, the same values for the rest, a
field's first type fixing it for the lines after. Two readers cut a chunk fast, and both read only
lines they are sure of. Where the package was built with a C compiler, ``_lineproto`` cuts and types
a chunk's plain lines in one pass; elsewhere ``_split_arrow`` does the same with Arrow's CSV reader
and kernels. Both hand back the same structure, and every line they set aside (escapes, comments,
a quote in a name, a second space, a value spelled in a rarer form, anything wrong) is read by
``lp_grammar`` with its line number. The distinct series of a chunk, a few hundred in a typical
export, are read once each, by ``lp_grammar`` too, and numbered for the whole file (``SERIES``), which
the merge keys on.

A line influxd refuses is an error that names the file, the line and influxd's reason; with
``reject`` it is counted instead, with examples (``LineProtocol.rejected``). A backfill differs from
influxd in three places, each its own reason: a line without a timestamp, text that is not UTF-8, and
a key that is a tag on some lines and a field on others (a table's column is one or the other).

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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain, islice, pairwise
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from timelake import memory
from timelake.sources import lp_grammar as grammar
from timelake.sources.base import SourceError, _line_chunks, _mapped_line_chunks

try:
    from timelake.sources import _lineproto  # compiled at install (_lineproto.c)
except ImportError:  # no compiler where it was installed, or a build for another machine (a Lambda layer)
    _lineproto = None  # type: ignore[assignment]  # absent: each caller checks and falls back to Arrow kernels

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
_MOST_ODD = 1 << 62  # lines a cut may set aside: all of them, every one is read by lp_grammar
_PLAIN_LONGEST = 65_000  # a longer line may pass influxd's key length limits: the Arrow cut sets it aside
_HOLD_BYTES = 256 << 20  # lines held in memory for the merge; beyond, they are spilled to disk by time
_SPILL_PARTS = 16  # files a spill is cut into (by a hash of the time), and again for any still above _HOLD_BYTES
_MERGE_SLICES = 256  # runs of rows the merge passes on as they are; with more, every row goes through the sort
_EXAMPLES = 5
_TRUE = ["t", "T", "true", "True", "TRUE"]
_FALSE = ["f", "F", "false", "False", "FALSE"]
ARROW_TYPES = {"float": pa.float64(), "integer": pa.int64(), "unsigned": pa.uint64(), "string": pa.string(),
               "boolean": pa.bool_()}
_KINDS = grammar.KINDS  # by the code each reader gives a kind
_SHARED = {1 << code: code for code in (grammar.FLOAT, grammar.INTEGER, grammar.UNSIGNED, grammar.BOOLEAN)}
_TAG = "tag"  # a key's role when it is a tag, next to the five kinds of a field (a column is one or the other)
_ONE_ROLE = "a table column is one or the other"
_DDL = (b"CREATE DATABASE ", b"CREATE RETENTION POLICY ")  # the DDL part of an influx_inspect export
_MASK = {" ": "\x01", ",": "\x02", "=": "\x03"}
_MASK_BYTES = np.frombuffer(bytes.maketrans("".join(_MASK).encode(), "".join(_MASK.values()).encode()), np.uint8)
_SEPARATOR = np.arange(256) != _MASK_BYTES
_UNMASK_BYTES = np.arange(256, dtype=np.uint8)
_UNMASK_BYTES[[ord(code) for code in _MASK.values()]] = [ord(char) for char in _MASK]
_NOT_PLAIN = np.zeros(256, dtype=bool)
_NOT_PLAIN[[0, 1, 2, 3, 9, 13, 92]] = True  # NUL, the masks, tab, carriage return, backslash: lines for lp_grammar
_FLOAT = r"^-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"  # a float as influxd reads one
_UNSIGNED_HINT = re.compile(rb"=[0-9]+u(?:[ ,]|$)")


class InfluxError(SourceError):
    """Line protocol that cannot be read, or a field whose type changes between points."""


Typed = tuple[dict[str, int], pa.Array | None]  # kind -> first line; the column, when spelled one way


class _Cut(NamedTuple):
    """A chunk cut into rows and cells, as ``_lineproto.split`` returns it (``_split_arrow`` alike).

    ``lines``: the chunk's lines; ``odd``/``odd_start``: each line set aside and where it begins;
    ``rows``: the line of each row; ``codes``: its series, numbering the series texts ``offsets``/
    ``text``; ``stamps``: its integer time; then the field ``keys``, each key's cell count, kinds (a
    bit per kind) and first line per kind (``first``), and the cells grouped by key (see ``_Cells``);
    ``joined``: lines that joined an earlier line's row; ``block``: where a block of rows begins.
    """

    lines: int
    odd: Any
    rows: Any
    codes: Any
    stamps: Any
    offsets: Any
    text: Any
    keys: list[str]
    counts: Any
    kinds: Any
    cell_row: Any
    cell_kind: Any
    cell_value: Any
    strings: Any
    first: Any
    joined: int
    block: Any
    odd_start: Any
    join: bool = False  # whether lines could join rows (then a block of rows is one series, a time once)


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
    starts: list[int] = field(init=False)
    bits: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.starts = [0, *np.cumsum(self.counts).tolist()]  # Python ints: a line may have thousands of keys
        self.bits = self.kinds.tolist()

    def columns(self, names: list[str], at: np.ndarray | None, lines: np.ndarray) -> dict[str, Typed]:
        """``column`` of every key. The keys of one kind with a cell on every row (a line of many fields
        has thousands) are slices of one array per kind, not an array each."""
        found: dict[str, Typed] = {}
        size = len(lines)
        dense = at is None and not self.joined and size > 0
        shared: dict[int, pa.Array] = {}
        for key, name in enumerate(names):
            bits = self.bits[key]
            start = self.starts[key]
            if dense and self.starts[key + 1] - start == size and bits in _SHARED:
                code = _SHARED[bits]
                if code not in shared:
                    view = {grammar.FLOAT: np.float64, grammar.INTEGER: np.int64, grammar.UNSIGNED: np.uint64}.get(code)
                    shared[code] = pa.array(self.value.view(view) if view else self.value.astype(bool))
                found[name] = ({_KINDS[code]: int(self.first[key][code])}, shared[code].slice(start, size))
            elif self.starts[key + 1] > start:
                typed = self.column(key, at, lines)
                if typed[0]:  # none of its cells on the rows kept
                    found[name] = typed
        return found

    def column(self, key: int, at: np.ndarray | None, lines: np.ndarray) -> Typed:
        """The kinds one key is spelled in (kind -> first line) and, when spelled one way, its column.

        ``at`` is the row in ``lines`` of each row the reader kept (-1: not the job's), None when the same.
        """
        start, end = self.starts[key], self.starts[key + 1]
        rows, kinds, values = self.row[start:end], self.kind[start:end], self.value[start:end]
        whole = True  # the key's cells of every line the reader kept: its strings are one run of ``text``
        if at is not None:
            rows = at[rows]
            keep = rows >= 0
            if not keep.all():
                rows, kinds, values, whole = rows[keep], kinds[keep], values[keep], False
        if not len(rows):
            return {}, None
        ordered = not self.joined or bool((rows[1:] > rows[:-1]).all())
        bits = self.bits[key]
        if bits & (bits - 1):  # spelled more than one way in the chunk; maybe in the job's lines too
            spelled = sorted((int(line), code) for code, line in enumerate(self.first[key]) if line >= 0) if at is None \
                else sorted((int(lines[rows[int(np.argmax(kinds == code))]]), code)
                            for code in np.flatnonzero(np.bincount(kinds, minlength=len(_KINDS))).tolist())
            if len(spelled) > 1:
                return {_KINDS[code]: line for line, code in spelled}, None
        code = bits.bit_length() - 1 if not bits & (bits - 1) else int(kinds[0])
        kind, size = _KINDS[code], len(lines)
        found = {kind: int(self.first[key][code]) if at is None else int(lines[rows[0]])}
        if kind == "string":
            if not ordered:
                order = np.argsort(rows, kind="stable")
                rows, values, whole = rows[order], values[order], False
            return found, self._strings(values & np.uint64(0xFFFFFFFF), values >> np.uint64(32), rows, size, whole)
        typed = {"float": values.view(np.float64), "integer": values.view(np.int64), "unsigned": values,
                 "boolean": values.astype(bool)}[kind]
        if len(rows) == size and ordered:  # a key at most once per row: then every row has it
            return found, pa.array(typed)
        full = np.zeros(size, dtype=typed.dtype)
        full[rows] = typed
        missing = np.ones(size, dtype=bool)
        missing[rows] = False
        return found, pa.array(full, mask=missing)

    def by_row(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every cell's row, key and kind, ordered by row (keys in their order within a row)."""
        keys = np.repeat(np.arange(len(self.counts)), self.counts)
        order = np.argsort(self.row, kind="stable")
        return self.row[order], keys[order], self.kind[order]

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
class _Aside:
    """The lines of a chunk the cut set aside, as influxd cuts them: ``blocks`` (first line, start, end)
    of each, ``gone`` the lines a line set aside reached over (a quoted newline), ``lines`` the lines
    before ``tail``, where a line begins that may go on in the next chunk (None: none does)."""

    lines: int
    blocks: list[tuple[int, int, int]]
    gone: np.ndarray
    tail: int | None


@dataclass
class _Part:
    """Rows of the job's measurement from one chunk, each field typed by its own spelling.

    ``kinds`` and ``tags`` give the first line of each key in each kind or as a tag: what must agree
    with the rest of the file is checked in file order by ``LineProtocol._check``.
    """

    lines: np.ndarray
    seen: set[str]
    tags: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)  # field -> kind -> first line
    batch: pa.RecordBatch | None = None


@dataclass
class _Entry:
    """One line of the job's measurement, for the checks in order (``LineProtocol._resolve``)."""

    line: int
    tags: list[str]
    cells: list[tuple[str, str | None]]  # key and kind (None: a value of no kind, refused)
    error: str | None = None  # influxd refused the point after creating ``cells``' fields


@dataclass
class _Chunk:
    """A chunk read: its parts, the lines refused (line, reason, text), the lines of the job's
    measurement with their keys when asked for (``entries``), and how to read the chunk again without
    the lines of a set, with a row per line and its entries (``again``), which the checks in order need."""

    parts: list[_Part]
    refused: list[tuple[int, str, bytes]]
    again: Callable[[set[int]], _Chunk]
    text: Callable[[list[int]], dict[int, bytes]]  # the text of lines, by number
    entries: list[_Entry] | None = None


class _Here:
    """An executor that runs each task at once, in the calling thread."""

    def __enter__(self) -> _Here:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 (handed on as a pool would, through the future)
            done.set_exception(e)
        return done


class LineProtocol:
    """Parses chunks of one stream; remembers each field's type and each tag, so that a line of another
    type (or role) is refused wherever in the file it comes.

    ``dialect`` 1 reads InfluxDB 1.x line protocol, 2 the 2.x one; with ``reject`` refused lines are
    counted in ``rejected`` (with ``examples``, and each given to ``noted`` when set) instead of failing
    the read.
    """

    def __init__(self, measurement: str, precision: str, origin: str, dialect: int = 1, reject: bool = False,
                 noted: Callable[[int, str, bytes], None] | None = None) -> None:
        self.measurement = measurement
        self.precision = precision
        self.origin = origin
        self.dialect = dialect
        self.reject = reject
        self.scale = _NS_PER[precision]
        self.kinds: dict[str, tuple[str, int]] = {}
        self.tags: dict[str, int] = {}  # tag key -> first line
        self.seen: set[str] = set()
        self.rejected = 0
        self.examples: list[str] = []
        self.noted = noted
        self.series: dict[tuple[tuple[str, str], ...], int] = {}  # tag pairs -> number, for SERIES
        self._known: dict[str, tuple[str | None, dict[str, str], str | None, int]] = {}  # series text -> _distinct's
        self._numbering = threading.Lock()

    def batches(self, stream: pa.NativeFile | mmap.mmap) -> Iterator[pa.RecordBatch]:
        """The points of the measurement, one row per line (with its line number in LINE)."""
        for chunk in self._split(stream):
            chunk = self._check(chunk)
            yield from (part.batch for part in chunk.parts if part.batch is not None and part.batch.num_rows)

    def scan(self, stream: pa.NativeFile | mmap.mmap) -> pa.Schema:
        """Tags and typed fields of the whole stream; raises on the first line influxd refuses (unless
        rejecting) and on a field's second type."""
        for chunk in self._split(stream):
            self._check(chunk)
        return self.schema()

    def schema(self) -> pa.Schema:
        return pa.schema([(TIME, TIME_TYPE), *((t, pa.string()) for t in sorted(self.tags)),
                          *((f, ARROW_TYPES[k]) for f, (k, _) in sorted(self.kinds.items()))])

    # --- the checks in file order ----------------------------------------------------------------

    def _check(self, chunk: _Chunk) -> _Chunk:
        """The chunk's lines against what earlier lines fixed: the first line refused is the error;
        rejecting, the lines of another type or role are left out and counted with the rest."""
        for part in chunk.parts:
            self.seen.update(part.seen)
        conflict = self._conflict(chunk.parts)
        if conflict is not None and self.reject:
            chunk = self._resolve(chunk.again(set()))
            for line, reason, text in chunk.refused:
                self._count(line, reason, text)
            return chunk
        if not self.reject:
            errors = [(line, 0, self._message(line, reason, text)) for line, reason, text in chunk.refused[:1]]
            if conflict is not None:
                errors.append((conflict[0], 1, conflict[1]))
            if errors:
                raise InfluxError(min(errors)[2])
        for line, reason, text in chunk.refused:
            self._count(line, reason, text)
        for part in chunk.parts:  # without a conflict, each key has one kind: the one it had, if any
            for key, spelled in part.kinds.items():
                kind, line = min(spelled.items(), key=lambda item: item[1]) if len(spelled) > 1 else \
                    next(iter(spelled.items()))
                known = self.kinds.get(key)
                if known is None or line < known[1]:
                    self.kinds[key] = (kind, line)
            for key, line in part.tags.items():
                self.tags[key] = min(line, self.tags.get(key, line))
        return chunk

    def _count(self, line: int, reason: str, text: bytes) -> None:
        self.rejected += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(self._message(line, reason, text))
        if self.noted is not None:
            self.noted(line, reason, text)

    def _conflict(self, parts: list[_Part]) -> tuple[int, str] | None:
        """The first line of the chunk whose field has another type than the field's first line, or
        whose key is a field where it was a tag (or the other way round); None when there is none."""
        parts = [part for part in parts if part.kinds or part.tags]
        if len(parts) == 1:  # the common chunk: a part of the cut's rows alone
            kinds, tags = parts[0].kinds, parts[0].tags
        else:
            kinds, tags = {}, {}
            for part in parts:
                for key, spelled in part.kinds.items():
                    known = kinds.setdefault(key, {})
                    for kind, line in spelled.items():
                        known[kind] = min(known.get(kind, line), line)
                for key, line in part.tags.items():
                    tags[key] = min(line, tags.get(key, line))
        doubt = [key for key, spelled in kinds.items()  # a line may have thousands of fields: one pass for the rest
                 if len(spelled) > 1 or key in tags or key in self.tags or key in self.kinds and self.kinds[key][0] not in spelled]
        doubt += [key for key in tags if key in self.kinds and key not in kinds]
        found: list[tuple[int, str]] = []
        for key in doubt:
            spelled = kinds.get(key, {})
            if spelled:
                ordered = sorted(spelled.items(), key=lambda item: item[1])
                first_kind, first_line = self.kinds.get(key, ordered[0])
                other = next(((kind, line) for kind, line in ordered if kind != first_kind), None)
                if other is not None:
                    found.append((other[1], f"field '{key}' of measurement '{self.measurement}' has two types in "
                                            f"{self.origin}: {first_kind} at line {first_line} and {other[0]} at line {other[1]}"))
            as_field = min(spelled.values()) if spelled else None
            as_tag = tags.get(key)
            if key in self.tags and as_field is not None:
                at, tag_line, field_line = as_field, self.tags[key], as_field
            elif key in self.kinds and as_tag is not None:
                at, tag_line, field_line = as_tag, as_tag, self.kinds[key][1]
            elif as_field is not None and as_tag is not None:
                at, tag_line, field_line = max(as_field, as_tag), as_tag, as_field
            else:
                continue
            found.append((at, f"'{key}' of measurement '{self.measurement}' is a tag at line {tag_line} and a field at "
                              f"line {field_line} in {self.origin}: {_ONE_ROLE}"))
        return min(found) if found else None

    def _resolve(self, chunk: _Chunk) -> _Chunk:
        """The lines of the chunk in order, as influxd writes them one at a time: a line with a field of
        another type than the field has (or a key in the other role) is refused and fixes nothing;
        a line influxd fails after creating its fields fixes those it created; any other line fixes
        the type of each new field and the role of each new key (in ``kinds`` and ``tags``, with the
        line). The chunk is read again without the lines refused here."""
        kinds = {key: kind for key, (kind, _) in self.kinds.items()}
        roles = dict.fromkeys(self.tags, _TAG)
        refused: dict[int, str] = {}
        for entry in sorted(chunk.entries or [], key=lambda entry: entry.line):
            clash = next((f"'{key}' is a tag on an earlier line and a field here: {_ONE_ROLE}" if key in roles else
                          f"field '{key}' is {kinds[key]} on an earlier line and {kind} here"
                          for key, kind in entry.cells
                          if kind is not None and roles.get(key, kinds.get(key, kind)) != kind), None)
            clash = clash or next((f"'{key}' is a field on an earlier line and a tag here: {_ONE_ROLE}"
                                   for key in entry.tags if key in kinds), None)
            if clash is not None:
                refused[entry.line] = clash
                continue
            for key, kind in entry.cells:
                if kind is None:
                    continue
                if key in kinds:
                    if entry.error is not None and kinds[key] != kind:
                        break  # the field created twice with two types: influxd stops creating here
                    continue
                kinds[key] = kind
                self.kinds[key] = (kind, entry.line)
            if entry.error is None:
                for key in entry.tags:
                    if roles.setdefault(key, _TAG) == _TAG:
                        self.tags.setdefault(key, entry.line)
        if not refused:
            return chunk
        again = chunk.again(set(refused))
        text = again.text(list(refused))
        again.refused = sorted([*again.refused, *((line, reason, text[line]) for line, reason in refused.items())])
        return again

    def _message(self, line: int, reason: str, text: bytes) -> str:
        if reason == "invalid number" and self.dialect == 1 and _UNSIGNED_HINT.search(text):
            reason += " (unsigned integers such as 1u are InfluxDB 2.x line protocol: read it with --format influx2)"
        shown = text[:120].decode(errors="replace") + ("…" if len(text) > 120 else "")
        return f"line {line} of {self.origin}: {reason}: {shown!r}"

    # --- chunks ----------------------------------------------------------------------------------

    def _split(self, stream: pa.NativeFile | mmap.mmap) -> Iterator[_Chunk]:
        """Chunks parsed and typed on threads (Arrow kernels release the GIL), in file order.

        Only parsing runs ahead, at most _AHEAD chunks: the checks stay in order, so the first line
        of each type, named when a type changes, is the first in the file. A memory-mapped file is
        cut into views that the threads read themselves, and each thread counts its chunk's lines, so
        the reading thread only finds where chunks end; the pages a chunk was read from are let go
        once it is parsed, so the map does not grow the process by the file's size. A line that
        goes on past its chunk's end (a newline inside a quoted value) is handed to the next chunk,
        and the last such tail is read when the file ends.
        """
        memory.tune()  # chunks and their arrays of about a megabyte each stay on the heap (reading in a new process: 15 % less CPU)
        mapped = stream if isinstance(stream, mmap.mmap) and _lineproto is not None else None
        chunks: Iterator[tuple[int, bytes | bytearray | memoryview]]
        if mapped is not None:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            chunks = _mapped_line_chunks(mapped, _CHUNK_BYTES, _series_tail)
        else:  # the Arrow reader's cut searches bytes: a map is read as a stream
            reader = pa.BufferReader(pa.py_buffer(stream)) if isinstance(stream, mmap.mmap) else stream
            chunks = ((0, chunk) for chunk in _line_chunks(reader, _CHUNK_BYTES, _series_tail, blank=True))
        head = list(islice(chunks, 2))  # a file of one chunk is read here: starting threads costs more
        small = len(head) < 2 or isinstance(stream, mmap.mmap) and len(stream) <= _CHUNK_BYTES
        with _Here() if small else ThreadPoolExecutor(max_workers=_AHEAD, thread_name_prefix="line-protocol") as pool:
            pending: deque[tuple[int, Future]] = deque()
            first: Future[tuple[int, bytes]] = Future()
            first.set_result((1, b""))
            released = 0
            for start, chunk in chain(head, chunks):
                if mapped is not None and mapped.size() < len(mapped):  # the pages past its end cannot be read
                    raise InfluxError(f"{self.origin} was cut short while it was read: {mapped.size():,} bytes "
                                      f"of {len(mapped):,}")
                following: Future[tuple[int, bytes]] = Future()
                pending.append((start, pool.submit(self._numbered, chunk, first, following)))
                first = following
                if len(pending) > _AHEAD:
                    yield pending.popleft()[1].result()
                    if mapped is not None:  # pages wholly before the oldest chunk still being read
                        released = _release(mapped, released, pending[0][0])
            while pending:
                yield pending.popleft()[1].result()
            line, tail = first.result()
            if tail:
                yield self._numbered(tail, first, Future(), final=True)

    def _numbered(self, chunk: bytes | bytearray | memoryview, first: Future, following: Future,
                  final: bool = False) -> _Chunk:
        """The chunk read, numbered from the line after the previous chunk's last.

        The chunk is cut first, which needs no numbers and counts its lines. The previous chunk was
        handed to the pool first, so it is being read on another thread (or is done) and soon tells
        this one where to start, and what of its end goes on into this chunk. An error is passed
        down the chain, so no thread waits on a chunk that failed.
        """
        try:
            cut = self._cut(chunk)
            line, carried = first.result()
            if carried and not final:
                chunk = bytes(carried) + bytes(chunk)
                cut = self._cut(chunk)
            aside = _aside(chunk, cut, final)
        except BaseException as e:
            following.set_exception(e)
            raise
        following.set_result((line + aside.lines, bytes(chunk[aside.tail:]) if aside.tail is not None else b""))
        return self._read(chunk, line, cut, aside)

    def _cut(self, chunk: bytes | bytearray | memoryview, join: bool = True) -> _Cut:
        if _lineproto is not None:
            parts = _lineproto.split(chunk, _MOST_ODD, join, self.dialect)
            assert parts is not None, "split returns None only past most_odd lines set aside, and _MOST_ODD is all"
            return _Cut._make((*parts, join))
        return _split_arrow(chunk.tobytes() if isinstance(chunk, memoryview) else bytes(chunk), self.dialect)

    def _read(self, chunk: bytes | bytearray | memoryview, first_line: int, cut: _Cut, aside: _Aside,
              drop: frozenset[int] = frozenset(), entries: bool = False) -> _Chunk:
        """The chunk's rows: those of the cut (unless a line set aside reached over them, their series
        is refused, or their time is outside influxd's range) and those lp_grammar reads of the lines
        set aside; the rows of lines in ``drop`` are left out. Where a row left out may stand for
        several lines (the cut joined them), the chunk is cut again with a row per line. With
        ``entries``, each line of the job's measurement is listed with its keys."""
        refused: list[tuple[int, str, bytes | None]] = []  # None: the text is taken from the chunk below
        points: list[tuple[int, grammar.Point]] = []
        listed: list[_Entry] = []
        seen: set[str] = set()
        for index, start, end in aside.blocks:
            line = first_line + index
            block = bytes(chunk[start:end])
            text = None if block.startswith(_DDL) else grammar.content(block)
            if text is None or line in drop:
                continue
            got = grammar.read_line(text, self.scale, self.dialect)
            if isinstance(got, str):
                refused.append((line, got, text))
                continue
            seen.add(got.measurement)
            if got.error is not None:
                refused.append((line, got.error, text))
            if got.measurement == self.measurement:
                points.append((line, got))
                tags = [key for key, _ in got.tags]
                cells = got.cells if got.error is not None else tuple((key, kind) for key, (kind, _) in got.fields.items())
                listed.append(_Entry(line, tags, [(key, None if kind is None else _KINDS[kind]) for key, kind in cells],
                                     got.error))
        native = self._native(chunk, first_line, cut, aside, drop, refused, listed if entries else None)
        if native is None:  # a row left out stands for more lines than its own: a row per line
            return self._read(chunk, first_line, self._cut(chunk, join=False), aside, drop, entries)
        parts = [native, self._points(points, seen)]
        missing = [line for line, _, text in refused if text is None]
        texts = _line_texts(chunk, first_line, missing) if missing else {}
        found = sorted(((line, reason, texts[line] if text is None else text) for line, reason, text in refused),
                       key=lambda item: item[0])
        return _Chunk(parts, found,
                      lambda more: self._read(chunk, first_line, self._cut(chunk, join=False), aside, drop | more, True),
                      lambda numbers: _line_texts(chunk, first_line, numbers), listed if entries else None)

    def _native(self, chunk: bytes | bytearray | memoryview, first_line: int, cut: _Cut, aside: _Aside,
                drop: frozenset[int], refused: list[tuple[int, str, bytes | None]], entries: list[_Entry] | None,
                ) -> _Part | None:
        """The part of the cut's rows, the rows refused added to ``refused`` (and with ``entries``, the
        rows of the job's measurement to it); None when a row left out joined other lines (``cut``
        joined), to be read again with a row per line."""
        rows, codes = np.frombuffer(cut.rows, np.int32), np.frombuffer(cut.codes, np.int32)
        stamps = np.frombuffer(cut.stamps, np.int64)
        offsets = np.frombuffer(cut.offsets, np.int32)
        distinct = pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(cut.text))
        measurement, tags, refusal, numbers = self._distinct(distinct, len(codes))
        lines = rows.astype(np.int64) + first_line
        refuse: np.ndarray | None = None  # rows refused here (None: none, as in most chunks)
        leave: np.ndarray | None = None  # rows of lines another line reached over, or dropped
        if any(reason is not None for reason in refusal):
            refuse = np.fromiter((reason is not None for reason in refusal), bool, len(refusal))[codes]
        low, high = -(-grammar.MIN_NS // self.scale), grammar.MAX_NS // self.scale
        if len(stamps) and (stamps.min() < low or stamps.max() > high):
            refuse = _either(refuse, (stamps < low) | (stamps > high))
        if len(aside.gone):
            leave = aside.gone[rows]
        if drop:
            leave = _either(leave, np.isin(lines, list(drop)))
        left_out = _either(refuse, leave)
        if cut.joined and left_out is not None and left_out.any():
            return None
        if refuse is not None:
            for row in np.flatnonzero(refuse if leave is None else refuse & ~leave):
                reason = refusal[codes[row]] or f"time outside range {grammar.MIN_NS} - {grammar.MAX_NS}"
                refused.append((int(lines[row]), reason, None))
        if left_out is None:  # the common chunk: each series of the cut has a row, and every row is kept
            part = _Part(lines, set(measurement.to_pylist()))
        else:
            ok = ~left_out
            present = np.bincount(codes[ok], minlength=len(measurement)) > 0
            part = _Part(lines[ok], {name for name, here in zip(measurement.to_pylist(), present, strict=True) if here})
        if self.measurement not in part.seen:
            return part
        ours = _mask(pc.equal(measurement, self.measurement))
        at, block = None, np.frombuffer(cut.block, np.bool_)
        if left_out is not None or not ours.all():  # another measurement, or rows left out
            mine = ours[codes] if left_out is None else ours[codes] & ~left_out
            at = np.full(len(rows), -1, dtype=np.int64)
            at[mine] = np.arange(int(mine.sum()))
            codes, stamps, lines, block = codes[mine], stamps[mine], lines[mine], block[mine]
        tag_columns, series = _tag_columns(tags, codes, numbers)
        first = np.frombuffer(cut.first, np.int64).reshape(-1, len(_KINDS))
        cells = _Cells(np.frombuffer(cut.counts, np.int64), np.frombuffer(cut.kinds, np.uint8),
                       np.frombuffer(cut.cell_row, np.int32), np.frombuffer(cut.cell_kind, np.uint8),
                       np.frombuffer(cut.cell_value, np.uint64), np.frombuffer(cut.strings, np.uint8),
                       np.where(first >= 0, first + first_line, -1), cut.joined > 0)
        typed = cells.columns(cut.keys, at, lines)
        if entries is not None:
            entries.extend(_row_entries(cells, at, lines, cut.keys, tag_columns))
        part.lines = lines
        self._fill(part, lines, pa.array(stamps * self.scale if self.scale != 1 else stamps), tag_columns, typed, series,
                   pa.array(block) if cut.join else None)
        return part

    def _points(self, points: list[tuple[int, grammar.Point]], seen: set[str]) -> _Part:
        """The part of the lines lp_grammar read: rows of those of the job's measurement that influxd
        writes. The fields of those it fails to write count for the fields' types: influxd checks
        them against earlier lines and creates them before it fails (two types of a field in one
        point is a conflict here, which the checks in order resolve)."""
        part = _Part(np.array([line for line, point in points if point.error is None], dtype=np.int64), seen)
        written = [(line, point) for line, point in points if point.error is None]
        for line, point in points:  # a failed point's fields were checked against earlier ones first
            for key, kind in point.cells if point.error is not None else ():
                if kind is not None:
                    part.kinds.setdefault(key, {}).setdefault(_KINDS[kind], line)
        if not written:
            return part
        lines = part.lines
        pairs = [dict(point.tags) for _, point in written]
        tags = {key: pa.array([found.get(key) for found in pairs], pa.string())
                for key in sorted({key for found in pairs for key in found})}
        with self._numbering:
            numbers = [self.series.setdefault(point.tags, len(self.series)) if len(self.series) < _SERIES_KEPT else None
                       for _, point in written]
        series = pa.array(numbers, pa.int64()) if None not in numbers else None
        cells: dict[str, tuple[dict[str, int], list[int], list[object]]] = {}  # key -> kinds, rows, values
        for row, (line, point) in enumerate(written):  # once over the cells: a line may have thousands
            for key, (kind, value) in point.fields.items():
                spelled, rows, values = cells.setdefault(key, ({}, [], []))
                spelled.setdefault(_KINDS[kind], line)
                rows.append(row)
                values.append(value)
        fields: dict[str, Typed] = {}
        for key, (spelled, rows, values) in sorted(cells.items()):
            column = None
            if len(spelled) == 1:
                column = pa.array(values, ARROW_TYPES[next(iter(spelled))])
                column = column if len(rows) == len(written) else _scatter(np.array(rows), column, len(written))
            fields[key] = (spelled, column)
        phantom = part.kinds
        part.kinds = {}
        self._fill(part, lines, pa.array([point.time for _, point in written], pa.int64()), tags, fields, series)
        for key, spelled in phantom.items():
            for name, first in spelled.items():
                known = part.kinds.setdefault(key, {})
                known[name] = min(first, known.get(name, first))
        return part

    def _fill(self, part: _Part, lines: np.ndarray, ns: pa.Array, tags: dict[str, pa.Array],
              fields: dict[str, Typed], series: pa.Array | None = None, block: pa.Array | None = None) -> None:
        """The part's batch: time, line numbers, tags, and each field typed by its spelling (all or nothing)."""
        part.tags = {key: int(lines[0 if not column.null_count else int(np.argmax(_mask(column.is_valid())))])
                     for key, column in tags.items()}
        time = ns.cast(TIME_TYPE)
        columns: dict[str, pa.Array] = {TIME: time, LINE: pa.array(lines, pa.int64()), **dict(sorted(tags.items()))}
        if series is not None:
            columns[SERIES] = series
        if block is not None:
            columns[BLOCK] = block
        for key, (kinds, typed) in sorted(fields.items(), key=lambda item: item[0]):
            part.kinds[key] = kinds
            if typed is not None:
                columns[key] = typed
        part.batch = pa.RecordBatch.from_pydict(columns)

    def _distinct(self, distinct: pa.Array,
                  rows: int) -> tuple[pa.Array, dict[str, pa.Array], list[str | None], np.ndarray | None]:
        """What lp_grammar reads of each distinct series text of a chunk (measurement, tags, or why it
        is refused), and each series' number for the whole file (None when too many are new to number
        here: then the merge hashes the tags).

        Texts seen in an earlier chunk are answered from memory: an export repeats its few hundred
        series in every chunk, and splitting and numbering them again cost a tenth of the reading.
        """
        texts = distinct.to_pylist()
        new = [i for i, text in enumerate(texts) if text not in self._known]
        if len(new) > _SERIES_MOST and len(new) * 8 > rows or len(self.series) + len(new) > _SERIES_KEPT:
            measurement, tags, refusal = _series(distinct, self.dialect)
            return measurement, tags, refusal, None
        if new:
            measurement, tags, refusal = _series(distinct.take(pa.array(new, pa.int64())), self.dialect)
            names, values = measurement.to_pylist(), {key: column.to_pylist() for key, column in tags.items()}
            with self._numbering:
                for j, i in enumerate(new):
                    pairs = tuple((key, column[j]) for key, column in sorted(values.items()) if column[j] is not None)
                    number = self.series.setdefault(pairs, len(self.series)) if names[j] == self.measurement else -1
                    self._known[texts[i]] = (names[j], dict(pairs), refusal[j], number)
        known = [self._known[text] for text in texts]
        keys = sorted({key for _, pairs, _, _ in known for key in pairs})
        return (pa.array([name for name, *_ in known], pa.string()),
                {key: pa.array([pairs.get(key) for _, pairs, _, _ in known], pa.string()) for key in keys},
                [reason for _, _, reason, _ in known],
                np.fromiter((number for *_, number in known), np.int64, len(known)))


def _either(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """The rows in either mask; None for none."""
    return b if a is None else a if b is None else a | b


def _row_entries(cells: _Cells, at: np.ndarray | None, lines: np.ndarray, keys: list[str],
                 tags: dict[str, pa.Array]) -> list[_Entry]:
    """Each row of the job's measurement with its tag keys and its fields' keys and kinds."""
    rows, key, kind = cells.by_row()
    if at is not None:
        rows = at[rows]
        keep = rows >= 0
        rows, key, kind = rows[keep], key[keep], kind[keep]
    present = {name: _mask(column.is_valid()) for name, column in tags.items()}
    found = [_Entry(int(line), [name for name, valid in present.items() if valid[i]], []) for i, line in enumerate(lines)]
    for row, k, c in zip(rows.tolist(), key.tolist(), kind.tolist(), strict=True):
        found[row].cells.append((keys[k], _KINDS[c]))
    return found


def _aside(chunk: bytes | bytearray | memoryview, cut: _Cut, final: bool) -> _Aside:
    """Where each line the cut set aside ends as influxd cuts lines (``lp_grammar.line_end``), and the
    lines those reach over; the first that may go on past the chunk ends the chunk's lines there,
    unless the chunk is the file's last."""
    odd, starts = np.frombuffer(cut.odd, np.int32), np.frombuffer(cut.odd_start, np.int32)
    blocks: list[tuple[int, int, int]] = []
    gone: np.ndarray = np.zeros(0, dtype=bool)
    reached = -1
    for index, start in zip(odd.tolist(), starts.tolist(), strict=True):
        if index <= reached:
            continue
        end = grammar.line_end(chunk, start, len(chunk), final)
        if end is None:
            if not len(gone):
                gone = np.zeros(cut.lines, dtype=bool)
            gone[index:] = True
            return _Aside(index, blocks, gone, start)
        newlines = bytes(chunk[start:end]).count(b"\n")
        if newlines:
            if not len(gone):
                gone = np.zeros(cut.lines, dtype=bool)
            gone[index + 1:index + 1 + newlines] = True
            reached = index + newlines
        blocks.append((index, start, end))
    return _Aside(cut.lines, blocks, gone, None)


def _line_texts(chunk: bytes | bytearray | memoryview, first_line: int, numbers: list[int]) -> dict[int, bytes]:
    """The text of some lines of a chunk (up to their newline), by line number."""
    view = np.frombuffer(chunk, np.uint8)
    ends = np.flatnonzero(view == 10)
    starts = np.concatenate([[0], ends + 1])
    ends = np.concatenate([ends, [len(view)]])
    return {line: bytes(chunk[starts[line - first_line]:ends[line - first_line]]) for line in numbers}



def _split_arrow(chunk: bytes, dialect: int) -> _Cut:
    """What ``_lineproto.split`` returns for a chunk (without joining lines), cut by Arrow's CSV reader
    and kernels: lines are cut at their spaces (separators inside a string value masked first), field
    sets at their commas and equal signs, and each value typed by a pattern of the spellings the
    compiled reader reads. A line of another shape is set aside, as the compiled reader sets it aside."""
    view = np.frombuffer(chunk, np.uint8)
    size = len(view)
    newlines = np.flatnonzero(view == 10)
    ends = newlines if size and view[-1] == 10 else np.append(newlines, size)
    starts = np.concatenate([[0], newlines + 1])[:len(ends)]
    count = len(ends)
    aside = (ends == starts) | (ends - starts > _PLAIN_LONGEST)
    if count:
        opening = view[np.minimum(starts, size - 1)]
        aside |= (opening == 32) | (opening == 35)
    if any(bytes([byte]) in chunk for byte in np.flatnonzero(_NOT_PLAIN).tolist()):  # memchr: usually none
        aside[np.searchsorted(ends, np.flatnonzero(_NOT_PLAIN[view]))] = True
    if not chunk.isascii():
        try:
            chunk.decode()
        except UnicodeDecodeError:  # the lines that are not UTF-8 are refused one by one
            for index in np.unique(np.searchsorted(ends, np.flatnonzero(view >= 0x80))).tolist():
                try:
                    chunk[starts[index]:ends[index]].decode()
                except UnicodeDecodeError:
                    aside[index] = True
    text: bytes | bytearray = chunk  # copied where a value's separators are masked or a line wiped
    if b'"' in chunk:
        spaces = np.flatnonzero(view == 32)
        first_space = spaces[np.minimum(np.searchsorted(spaces, starts), len(spaces) - 1)] if len(spaces) else ends
        aside |= (first_space >= ends) | (first_space < starts)
        quotes = np.flatnonzero(view == 34)
        text = bytearray(chunk)
        _mask_values(view, np.frombuffer(text, np.uint8), quotes, np.searchsorted(ends, quotes), first_space, aside)
    wiped = np.flatnonzero(aside & (ends > starts))
    if len(wiped):  # a line set aside is left out of the CSV: its bytes become one field (an invalid row)
        if text is chunk:
            text = bytearray(chunk)
        lengths = ends[wiped] - starts[wiped]
        np.frombuffer(text, np.uint8)[np.repeat(starts[wiped] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
                                      + np.arange(int(lengths.sum()))] = 1
    invalid: list[int] = []

    def left_out(row: pcsv.InvalidRow) -> str:
        invalid.append(row.number - 1)
        return "skip"

    table = pcsv.read_csv(
        pa.BufferReader(text),
        pcsv.ReadOptions(column_names=["s", "f", "t"], block_size=size + 1, use_threads=False),
        pcsv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False, double_quote=False,
                          newlines_in_values=False, ignore_empty_lines=False, invalid_row_handler=left_out),
        pcsv.ConvertOptions(column_types={"s": pa.dictionary(pa.int32(), pa.string()), "f": pa.string(), "t": pa.string()},
                            strings_can_be_null=False)) if size else None
    rows = np.delete(np.arange(count), invalid)
    aside[invalid] = True
    return _cells(count, starts, aside, rows, table, dialect, b'"' in chunk)


def _mask_values(view: np.ndarray, masked: np.ndarray, quotes: np.ndarray, line: np.ndarray, first_space: np.ndarray,
                 aside: np.ndarray) -> None:
    """Spaces, commas and equal signs inside each quoted field value masked (``_MASK``), for the lines
    whose quotes all pair up as string values: opened right after an equal sign and closed before a
    comma, a space or the line's end. Any other line with a quote is set aside."""
    in_key = quotes < first_space[line]
    aside[line[in_key]] = True  # a quote in a series is a character of it: such lines are read one by one
    quotes, line = quotes[~in_key], line[~in_key]
    if not len(quotes):
        return
    runs = np.flatnonzero(np.concatenate([[True], line[1:] != line[:-1]]))
    index = np.arange(len(quotes)) - np.repeat(runs, np.diff(np.append(runs, len(quotes))))
    after = np.where(quotes + 1 < len(view), view[np.minimum(quotes + 1, len(view) - 1)], 10)
    bad = np.where(index % 2 == 0, view[quotes - 1] != 61, (after != 44) & (after != 32) & (after != 10))
    aside[line[bad]] = True
    aside[line[np.isin(line, np.flatnonzero(np.bincount(line) % 2))]] = True  # a value's quote left open
    opens = np.flatnonzero((index % 2 == 0) & ~aside[line])
    if not len(opens):
        return
    first, last = quotes[opens] + 1, quotes[opens + 1]
    sizes = last - first
    inside = np.repeat(first - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(int(sizes.sum()))
    found = inside[_SEPARATOR[view[inside]]]
    masked[found] = _MASK_BYTES[view[found]]


def _cells(count: int, starts: np.ndarray, aside: np.ndarray, rows: np.ndarray, table: pa.Table | None,
           dialect: int, quotes: bool) -> _Cut:
    """The rows the CSV reader cut (``rows``: the line of each), with their field sets cut into typed
    cells; a row whose field set or timestamp is not of a plain spelling is set aside instead."""
    if table is None or not table.num_rows:
        return _empty_cut(count, starts, aside)
    table = table.filter(pa.array(~aside[rows]))
    rows = rows[~aside[rows]]
    stamps = table.column("t").combine_chunks()
    stamps, ok = _integers(stamps, signed=True)
    fields = table.column("f").combine_chunks()
    pairs = pc.count_substring(fields, "=").to_numpy(zero_copy_only=False)
    ok &= pairs == pc.count_substring(fields, ",").to_numpy(zero_copy_only=False) + 1  # key=value, every part
    whole = ok.all()  # each part of these rows cut at its one equal sign: keys and values alternate
    flat = pc.list_flatten(pc.split_pattern(pc.replace_substring(fields if whole else fields.filter(pa.array(ok)),
                                                                 "=", ","), ","))
    parent = np.repeat(np.arange(len(fields)), np.where(ok, pairs, 0))
    keys, values = flat.take(pa.array(np.arange(0, len(flat), 2))), flat.take(pa.array(np.arange(1, len(flat), 2)))
    encoded = keys.dictionary_encode()
    key = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names = encoded.dictionary.to_pylist()
    bad_keys = [code for code, name in enumerate(names) if not name or name == "time" or '"' in name]
    if bad_keys:
        ok[parent[np.isin(key, bad_keys)]] = False
    kind = np.full(len(values), -1, dtype=np.int8)
    number = np.zeros(len(values), dtype=np.uint64)
    quoted = _mask(pc.starts_with(values, '"')) if quotes else np.zeros(len(values), dtype=bool)
    if quoted.any():
        at = np.flatnonzero(quoted)
        inside = values.take(pa.array(at))
        kind[at[_mask(pc.ends_with(inside, '"')) & (pc.utf8_length(inside).to_numpy(zero_copy_only=False) >= 2)]] = \
            grammar.STRING
    boolean = _mask(pc.is_in(values, pa.array(_TRUE + _FALSE)))
    kind[boolean] = grammar.BOOLEAN
    number[boolean] = _mask(pc.is_in(values.filter(pa.array(boolean)), pa.array(_TRUE)))
    last = pc.utf8_slice_codeunits(values, -1)
    suffix = {grammar.INTEGER: _mask(pc.equal(last, "i")), grammar.UNSIGNED: _mask(pc.equal(last, "u"))}
    for code, at in suffix.items():
        at = np.flatnonzero(at & ~quoted)
        if code == grammar.UNSIGNED and dialect == 1 or not len(at):
            continue
        typed, fits = _integers(pc.utf8_slice_codeunits(values.take(pa.array(at)), 0, -1), signed=code == grammar.INTEGER)
        kind[at[fits]] = code
        number[at[fits]] = typed.view(np.uint64)[fits]
    at = np.flatnonzero((kind < 0) & ~quoted & ~suffix[grammar.INTEGER] & ~suffix[grammar.UNSIGNED])
    real, fits = _floats(values.take(pa.array(at)))
    kind[at[fits]] = grammar.FLOAT
    number[at[fits]] = real.view(np.uint64)[fits]
    ok[parent[kind < 0]] = False
    order = np.lexsort((key, parent))
    twice = (parent[order][1:] == parent[order][:-1]) & (key[order][1:] == key[order][:-1])
    ok[parent[order][1:][twice]] = False
    aside[rows[~ok]] = True
    kept = np.full(len(ok), -1, dtype=np.int64)
    kept[ok] = np.arange(int(ok.sum()))
    mine = ok[parent]
    cell_row, key, kind, number = kept[parent[mine]], key[mine], kind[mine], number[mine]
    values = values.filter(pa.array(mine))
    group = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=len(names)).astype(np.int64)
    kinds = np.zeros(len(names), dtype=np.uint8)
    np.bitwise_or.at(kinds, key, (1 << kind.astype(np.uint8)).astype(np.uint8))
    first = np.full((len(names), len(_KINDS)), -1, dtype=np.int64)
    line_of = rows[ok]
    slot = key[group] * len(_KINDS) + kind[group]
    unique, at = np.unique(slot, return_index=True)
    first.reshape(-1)[unique] = line_of[cell_row[group][at]]
    cell_row, kind, number = cell_row[group], kind[group], number[group]
    strings = np.flatnonzero(kind == grammar.STRING)
    text = b""
    if len(strings):
        inner = _unmask(pc.utf8_slice_codeunits(values.take(pa.array(group[strings])), 1, -1))
        offsets = np.frombuffer(inner.buffers()[1], np.int32)[inner.offset:inner.offset + len(inner) + 1].astype(np.uint64)
        number[strings] = (offsets[:-1] - offsets[0]) | ((offsets[1:] - offsets[:-1]) << np.uint64(32))
        data = inner.buffers()[2]
        text = data.to_pybytes()[int(offsets[0]):int(offsets[-1])] if data is not None else b""
    series = table.column("s").combine_chunks().filter(pa.array(ok))
    used, codes = np.unique(series.indices.to_numpy(zero_copy_only=False), return_inverse=True)
    distinct = series.dictionary.take(pa.array(used, pa.int32()))
    series_offsets = np.frombuffer(distinct.buffers()[1], np.int32)[distinct.offset:distinct.offset + len(distinct) + 1]
    data = distinct.buffers()[2]
    data = b"" if data is None else data.to_pybytes()[int(series_offsets[0]):int(series_offsets[-1])]
    return _Cut(count, np.flatnonzero(aside).astype(np.int32), line_of.astype(np.int32), codes.astype(np.int32),
                stamps[ok], (series_offsets - series_offsets[0]).astype(np.int32), data,
                names, counts, kinds, cell_row.astype(np.int32), kind.astype(np.uint8), number, np.frombuffer(text, np.uint8),
                first, 0, np.ones(len(line_of), dtype=np.uint8), starts[aside].astype(np.int32))


def _empty_cut(count: int, starts: np.ndarray, aside: np.ndarray) -> _Cut:
    aside[:] = True
    none = np.zeros(0, dtype=np.int32)
    return _Cut(count, np.arange(count, dtype=np.int32), none, none, np.zeros(0, np.int64), np.zeros(1, np.int32), b"",
                [], np.zeros(0, np.int64), np.zeros(0, np.uint8), none, np.zeros(0, np.uint8), np.zeros(0, np.uint64),
                np.zeros(0, np.uint8), np.zeros((0, len(_KINDS)), np.int64), 0, np.zeros(0, np.uint8),
                starts.astype(np.int32))


def _integers(texts: pa.Array, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Which texts are a decimal integer of 64 bits (a minus only when ``signed``), and their values
    (zero where not): checked with kernels, as Arrow's cast also reads ``0x10`` or ``+5``."""
    negative = _mask(pc.starts_with(texts, "-")) if signed else np.zeros(len(texts), dtype=bool)
    body = pc.if_else(pa.array(negative), pc.utf8_slice_codeunits(texts, 1), texts) if negative.any() else texts
    size = pc.utf8_length(body).to_numpy(zero_copy_only=False)
    width = 19 if signed else 20
    fits = _mask(pc.ascii_is_decimal(body)) & (size <= width)
    at = np.flatnonzero(fits & (size == width))
    if len(at):  # as wide as the largest: compared as text, digit by digit
        widest = body.take(pa.array(at))
        limit = "9223372036854775807" if signed else "18446744073709551615"
        fits[at] = _mask(pc.if_else(pa.array(negative[at]), pc.less_equal(widest, "9223372036854775808"),
                                    pc.less_equal(widest, limit)))
    values = np.zeros(len(texts), dtype=np.int64 if signed else np.uint64)
    if fits.any():
        values[fits] = texts.filter(pa.array(fits)).cast(pa.int64() if signed else pa.uint64()).to_numpy()
    return values, fits


def _floats(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Which texts are a float as influxd reads one (digits, at most one point, an exponent: no sign
    but a minus, no ``inf`` or ``nan``, within the doubles), and their values. Arrow's cast reads a
    superset of those; the pattern decides only when some text does not cast."""
    try:
        real = texts.cast(pa.float64()).to_numpy(zero_copy_only=False)
        fits = np.ones(len(texts), dtype=bool)
    except pa.ArrowInvalid:
        fits = _mask(pc.match_substring_regex(texts, _FLOAT))
        real = np.zeros(len(texts), dtype=np.float64)
        real[fits] = texts.filter(pa.array(fits)).cast(pa.float64()).to_numpy(zero_copy_only=False)
    fits &= np.isfinite(real) & ~_mask(pc.starts_with(texts, "+"))
    return real, fits


def _series(distinct: pa.Array, dialect: int) -> tuple[pa.Array, dict[str, pa.Array], list[str | None]]:
    """Measurement, tags (key -> value per distinct series) and why each series is refused (None: it
    is not), with Arrow kernels, for chunks of many new series. A series the kernels cannot vouch for
    (a second equal sign in a tag, a missing value, a tag given twice, a reserved key) is read by
    lp_grammar."""
    parts = pc.split_pattern(distinct, ",")
    measurement = pc.list_element(parts, 0)
    doubt = ~_mask(pc.not_equal(measurement, "")) | (pc.utf8_length(distinct).to_numpy(zero_copy_only=False) > grammar.MAX_KEY)
    tags = pc.list_slice(parts, 1)
    rows = np.asarray(pc.list_parent_indices(tags))
    flat = pc.list_flatten(tags)
    pairs = pc.split_pattern(flat, "=", max_splits=1)
    whole = (pc.list_value_length(pairs).to_numpy(zero_copy_only=False) == 2) & \
        (pc.count_substring(flat, "=").to_numpy(zero_copy_only=False) == 1)
    doubt[rows[~whole]] = True
    pairs, rows = pairs.filter(pa.array(whole)), rows[whole]
    keys, values = pc.list_element(pairs, 0), pc.list_element(pairs, 1)
    reserved = ["time"] if dialect == 1 else ["time", "_field", "_measurement"]
    doubt[rows[_mask(pc.or_(pc.or_(pc.equal(keys, ""), pc.equal(values, "")), pc.is_in(keys, pa.array(reserved))))]] = True
    code = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False)
    order = np.lexsort((code, rows))
    doubt[rows[order][1:][(rows[order][1:] == rows[order][:-1]) & (code[order][1:] == code[order][:-1])]] = True
    refusal: list[str | None] = [None] * len(distinct)
    names = measurement.to_pylist()
    columns = {key: _scatter(rows[at], values.filter(pa.array(at)), len(distinct)).to_pylist() for key, at in _groups(keys)}
    for i in np.flatnonzero(doubt).tolist():
        got = grammar.read_key(distinct[i].as_py().encode(), dialect)
        if isinstance(got, str):
            refusal[i], names[i] = got, None
            for column in columns.values():
                column[i] = None
            continue
        names[i] = got[0]
        for column in columns.values():
            column[i] = None
        for key, value in got[1]:
            columns.setdefault(key, [None] * len(distinct))[i] = value
    return pa.array(names, pa.string()), {key: pa.array(column, pa.string()) for key, column in columns.items()}, refusal


def _tag_columns(tags: dict[str, pa.Array], codes: np.ndarray,
                 numbers: np.ndarray | None) -> tuple[dict[str, pa.Array], pa.Array | None]:
    """Tag columns of the rows of series ``codes``, from each tag's value per distinct series, and
    each row's series number (for the merge, which then hashes no tag strings)."""
    columns = {key: column for key, column in ((key, values.take(pa.array(codes))) for key, values in tags.items())
               if column.null_count < len(column)}
    return columns, (pa.array(numbers[codes]) if numbers is not None else None)


def _unmask(values: pa.Array) -> pa.Array:
    """Masked separators back to themselves: one table lookup over the values' bytes (offsets kept)."""
    validity, offsets, data = values.buffers()
    if data is None:
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
    if isinstance(block, memoryview):  # not from the readers here (see above), but a view has no find
        block = bytearray(block)
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


class Parser(Protocol):
    """What the merge needs of a reader: its tags, and the schema of the whole file read so far."""

    tags: dict[str, int]

    def schema(self) -> pa.Schema: ...


def points(parser: Parser, lines: Iterator[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
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
            have = set(table.column_names)  # a set: a line may have thousands of fields
            columns = [table.column(f.name) if f.name in have else pa.nulls(table.num_rows, f.type) for f in schema]
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
            self.nbytes += batch.get_total_buffer_size()
            if self.nbytes > _HOLD_BYTES:
                self.folder = folder = tempfile.TemporaryDirectory(prefix="timelake-influx-")
                self.writers, self.files = [None] * _SPILL_PARTS, [[] for _ in range(_SPILL_PARTS)]
                held, self.batches = self.batches, []
                for each in held:
                    self._spill(each, folder)
            return
        self._spill(batch, self.folder)

    def _spill(self, batch: pa.RecordBatch, folder: tempfile.TemporaryDirectory) -> None:
        """The batch cut by a hash of its time into the part files, all written with the widest schema so far."""
        if BLOCK in batch.schema.names:  # cut by time into parts, a block no longer holds its rows together
            batch = batch.drop_columns([BLOCK])
        grown = pa.unify_schemas([self.schema, batch.schema])
        if not grown.equals(self.schema):
            self.schema = grown
            self._close_writers()
        have = set(batch.schema.names)
        batch = pa.RecordBatch.from_arrays(
            [batch.column(f.name) if f.name in have else pa.nulls(batch.num_rows, f.type) for f in self.schema],
            schema=self.schema)
        part = _time_hash(batch.column(0), self.level)
        order = np.argsort(part, kind="stable")
        counts = np.bincount(part, minlength=_SPILL_PARTS)
        batch = batch.take(pa.array(order))
        start = 0
        for index, count in enumerate(counts):
            if count:
                writer = self.writers[index]
                if writer is None:
                    path = Path(folder.name) / f"{index}-{len(self.files[index])}.arrow"
                    self.files[index].append(path)
                    writer = self.writers[index] = pa.ipc.new_stream(str(path), self.schema)
                writer.write_batch(batch.slice(start, count))
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
    have = set(table.column_names)
    columns = {name: table.column(name).take(keys) for name in (TIME, *(t for t in tags if t in have))}
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
    have = set(table.column_names)
    for tag in tags:
        if tag not in have:
            continue
        encoded = pc.dictionary_encode(table.column(tag)).combine_chunks()
        values = encoded.indices.fill_null(-1).to_numpy().astype(np.int64) + 1
        size = len(encoded.dictionary) + 1
        if span * size >= 2**62:
            dense = pc.dictionary_encode(pa.array(code))
            code, span = dense.indices.to_numpy().astype(np.int64), len(dense.dictionary)
        code, span = code * size + values, span * size
    return code, span
