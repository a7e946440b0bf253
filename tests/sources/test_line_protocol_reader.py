"""The compiled line-protocol reader against the Arrow one: for any file, the same rows or the same error.

Both readers read only lines of the plain shape and set every other line aside for ``lp_grammar``,
so what they must never do is accept a line and read it differently. Generated files mix plain
lines with every spelling at the edge of a kind (a sign, an exponent, an integer one past 64 bits,
a quoted separator, an escape), comments and blank lines. How both read against influxd itself is
``test_line_protocol_influxd``.
"""

from __future__ import annotations

import functools
import gzip
import mmap
import random
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from timelake.sources import base, line_protocol
from timelake.sources.influx import open_influx_files

NS = 1_700_000_000_000_000_000
FLOATS = ["1", "-0", "0.5", "-2.25e3", "1E-5", "12.000", "+1.5", "1.", ".5", "inf", "NaN", "1.2.3", "1e",
          "123456789012345678901234", "0.1e400", "4.9e-324", "9007199254740993", "0.30000000000000004", "x"]
BOOLEANS = ["t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE", "tRUE", "yes"]


@functools.cache  # strategies are immutable: built and validated once, not on every draw
def _value(key: str, clean: bool) -> st.SearchStrategy[str]:
    """Any spelling; or, for a clean file, one kind per key spelled in the forms a reader must accept."""
    if clean:
        return {"value": st.one_of(st.sampled_from(FLOATS[:6]), st.floats(allow_nan=False, allow_infinity=False).map(repr)),
                "count": st.integers(-(2**63), 2**63 - 1).map(lambda i: f"{i}i"),
                "state": st.text(alphabet=' ab,=é', max_size=5).map(lambda t: '"' + t + '"'),
                "ok": st.sampled_from(BOOLEANS[:10])}[key]
    return st.one_of(
        st.sampled_from(FLOATS),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.integers(-(2**64), 2**64).map(lambda i: f"{i}i"),
        st.integers(-3, 2**65).map(lambda i: f"{i}u"),
        st.sampled_from(BOOLEANS),
        st.text(alphabet=' ab,="é\\', max_size=5).map(lambda t: '"' + t + '"'),
    )


@functools.cache
def _line_parts(clean: bool) -> dict[str, st.SearchStrategy]:
    """The strategies `_line` draws from, built once per kind of file (each draw then only draws)."""
    return {
        "shape": st.integers(1 if clean else 0, 19),
        "odd": st.sampled_from(["", "# a comment", "CREATE DATABASE x", "sensor value=1", "sensor"]),
        "measurement": st.sampled_from(["sensor", "sensor", "sensor", "other", *([] if clean else ["sen\\ sor"])]),
        "tags": st.lists(st.sampled_from(["device_id=d0", "device_id=d1", "site=north", "site=north\\ wing", "zone=é"]),
                         max_size=2, unique_by=lambda t: t.split("=")[0]),
        "keys": st.lists(st.sampled_from(["value", "count", "state", "ok"]), min_size=1, max_size=3),
        "end": st.sampled_from([""] if clean else ["", "", "", "\r", " "]),
    }


@functools.cache
def _line(index: int, clean: bool) -> st.SearchStrategy[str]:
    return _draw_line(index, clean)


@st.composite
def _draw_line(draw: st.DrawFn, index: int, clean: bool) -> str:
    parts = _line_parts(clean)
    shape = draw(parts["shape"])
    if shape == 0:
        return draw(parts["odd"])
    measurement = draw(parts["measurement"])
    tags = draw(parts["tags"])
    keys = draw(parts["keys"])
    fields = ",".join(f"{key}={draw(_value(key, clean))}" for key in keys)
    line = " ".join(part for part in (",".join([measurement, *tags]), fields, draw(_stamps(index, clean))) if part)
    return line + draw(parts["end"])


@functools.cache
def _stamps(index: int, clean: bool) -> st.SearchStrategy[str]:
    return st.sampled_from([str(NS + index), f"-{index}"] + ([] if clean else ["", "12x", "99999999999999999999"]))


@st.composite
def _file(draw: st.DrawFn) -> list[str]:
    """Half the files clean (rows to compare), half with any spelling (mostly an error to compare)."""
    clean = draw(st.booleans())
    return [draw(_line(index, clean)) for index in range(draw(st.integers(1, 30)))]


def _read(path: Path, kind: str = "influx") -> pa.Table | str:
    try:
        batches = [b.data for b in open_influx_files(str(path), "sensor", "ns", 1_000, kind).batches()]
    except line_protocol.InfluxError as e:
        return f"InfluxError: {e}"
    if not batches:
        return "no rows"
    table = pa.Table.from_batches(batches)  # rows in any order: lines set aside may come after their chunk's
    return table.select(sorted(table.column_names)).sort_by([(name, "ascending") for name in sorted(table.column_names)])


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=_file(), chunk=st.sampled_from([60, 300, 1 << 20]))
def test_compiled_reader_reads_any_file_as_the_arrow_reader(tmp_path: Path, monkeypatch, lines: list[str],
                                                            chunk: int) -> None:
    assert line_protocol._lineproto is not None, "the install did not build timelake/sources/_lineproto.c"
    path = tmp_path / "export.lp"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with monkeypatch.context() as patch:
        patch.setattr(line_protocol, "_CHUNK_BYTES", chunk)
        compiled = _read(path)
        patch.setattr(line_protocol, "_lineproto", None)
        arrow = _read(path)
    if isinstance(arrow, str) or isinstance(compiled, str):
        assert compiled == arrow
        event("error or no rows")
    else:
        assert compiled.equals(arrow), (compiled.to_pylist(), arrow.to_pylist())
        event("rows")


@pytest.mark.parametrize(("spelled", "typed", "kind"), [
    ("0.1", 0.1, pa.float64()), ("-2.5e-3", -0.0025, pa.float64()), ("9007199254740993", 9007199254740992.0, pa.float64()),
    ("123456789012345678901234.5", 1.2345678901234568e23, pa.float64()), ("-9223372036854775808i", -(2**63), pa.int64()),
    ("18446744073709551615u", 2**64 - 1, pa.uint64()), ('"a, b=c d"', "a, b=c d", pa.string()), ("FALSE", False, pa.bool_()),
])
def test_compiled_reader_types_each_spelling_exactly(tmp_path: Path, spelled: str, typed: object, kind: pa.DataType) -> None:
    """Unsigned integers are InfluxDB 2.x line protocol: the 1.x reader sets them aside, and refuses them."""
    path = tmp_path / "one.lp"
    path.write_text(f"sensor,device_id=d0 x={spelled} {NS}\n" * 3)
    unsigned = kind == pa.uint64()
    assert line_protocol._lineproto.split(path.read_bytes(), 0, True, 2 if unsigned else 1) is not None  # none set aside
    table = _read(path, "influx2" if unsigned else "influx")
    assert table["x"].type == kind and table["x"].to_pylist() == [typed]  # one point: the three lines merged
    if unsigned:
        assert line_protocol._lineproto.split(path.read_bytes(), 0) is None
        assert _read(path) == (f"InfluxError: line 1 of {path}: invalid number (unsigned integers such as 1u are "
                               f"InfluxDB 2.x line protocol: read it with --format influx2): "
                               f"'sensor,device_id=d0 x={spelled} {NS}'")


def test_compiled_reader_sets_aside_what_it_does_not_read(tmp_path: Path) -> None:
    """Lines it leaves to the general split come back by number; beyond ``most_odd`` it gives the chunk up."""
    lines = [f"sensor,device_id=d0 x=1.5 {NS}", "# comment", f"sensor,site=a\\ b x=1 {NS}", f"sensor x=+1 {NS}",
             f"sensor x=1,x=2 {NS}", f"sensor x=9223372036854775808i {NS}", f"sensor x=1 {NS} extra", "",
             f"sensor x=1.5 {NS}"]
    got = line_protocol._lineproto.split("\n".join(lines).encode(), 10)
    lines_read, odd, rows = got[0], memoryview(got[1]).cast("i").tolist(), memoryview(got[2]).cast("i").tolist()
    assert lines_read == len(lines) and rows == [0, 8] and odd == [1, 2, 3, 4, 5, 6, 7]
    assert line_protocol._lineproto.split("\n".join(lines).encode(), 6) is None


def test_series_numbered_or_not_the_points_merge_alike(tmp_path: Path, monkeypatch) -> None:
    """Lines of one point are merged by the series numbers the reader keeps; past what it keeps (many
    series) the merge hashes the tags instead, and the rows are the same."""
    lines = [f"sensor,device_id=d{i % 40},site=s{i % 3} {key}={i}{suffix} {NS + (i // 40) * 1_000}"
             for key, suffix in (("value", ""), ("count", "i")) for i in range(400)]
    path = tmp_path / "export.lp"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 2_000)
    numbered = _read(path)
    monkeypatch.setattr(line_protocol, "_SERIES_KEPT", 50)  # numbering stops partway through the file
    assert _read(path).equals(numbered)
    assert numbered.num_rows == 400 and numbered["count"].null_count == 0 and numbered["value"].null_count == 0


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(data=st.binary(max_size=9000), newlines=st.integers(0, 400), seed=st.integers(0, 2**32 - 1))
def test_compiled_newline_count_is_exact(data: bytes, newlines: int, seed: int) -> None:
    """The compiled reader sizes a chunk's per-line buffers by this count and the reader numbers lines by
    it: sixteen bytes at a time, 255 rounds between sums, then the tail, all must count alike."""
    chunk = bytearray(data)
    for position in random.Random(seed).choices(range(len(chunk) + 1), k=newlines):
        chunk[position:position] = b"\n"
    assert line_protocol._lineproto.newlines(chunk) == chunk.count(b"\n")
    assert line_protocol._newlines(chunk) == chunk.count(b"\n")


def test_compiled_newline_count_of_long_runs() -> None:
    for size in (0, 1, 15, 16, 17, 255 * 16 - 1, 255 * 16, 255 * 16 + 1, 3 * 255 * 16 + 7):
        assert line_protocol._lineproto.newlines(b"\n" * size) == size
        assert line_protocol._lineproto.newlines(b"x" * size) == 0


def test_the_compiled_reader_leaves_the_allocator_settings_alone() -> None:
    """An embeddable library must not change the process's malloc settings for good: the reader warms
    glibc's adaptive thresholds (`timelake.memory.tune`) instead. The built module imports no ``mallopt``
    (its dynamic symbol table would name it)."""
    assert b"mallopt" not in Path(line_protocol._lineproto.__file__).read_bytes()


_TSM_FIELDS = {"value": "{}.5", "count": "{}i", "state": '"s{}"', "ok": "{}"}
_TSM_SERIES = ["sensor,device_id=d0", "sensor,device_id=d1,site=a", "sensor,device_id=d2",
               "other,device_id=d0", "sensor,site=a\\ b"]


_TSM_DRAWS = {  # built once: building and validating a strategy on every draw cost more than the reads
    "shards": st.integers(1, 3), "start": st.integers(0, 40),
    "series": st.lists(st.sampled_from(_TSM_SERIES), min_size=1, max_size=4, unique=True),
    "keys": st.lists(st.sampled_from(list(_TSM_FIELDS)), min_size=1, max_size=4, unique=True),
    "gaps": st.sampled_from([0, 3, 10]),
}
_integers = functools.cache(st.integers)


@functools.cache
def _integers_list(low: int, high: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(low, high), min_size=1, max_size=30)


@st.composite
def _tsm_export(draw: st.DrawFn) -> list[str]:
    """An export as influx_inspect writes it: per shard, per series, per field a run of lines in time
    order. With what real ones hold: a field missing at some times, shards that overlap in time (a
    point given twice: the later line wins), another measurement and an escaped tag between runs,
    and a value the compiled reader leaves to ``lp_grammar`` (``12.``) inside a run."""
    lines = []
    for shard in range(draw(_TSM_DRAWS["shards"])):
        start = draw(_TSM_DRAWS["start"])
        for series in draw(_TSM_DRAWS["series"]):
            times = sorted(set(draw(_integers_list(start, start + 40))))
            for key in draw(_TSM_DRAWS["keys"]):
                gaps = draw(_TSM_DRAWS["gaps"])
                for t in times:
                    if gaps and draw(_integers(0, gaps)) == 0:
                        continue  # the field missing at this time
                    value = _TSM_FIELDS[key].format("t" if key == "ok" and t % 2 else "F" if key == "ok" else t + shard)
                    if key == "value" and draw(_integers(0, 29)) == 0:
                        value = value.split(".")[0] + "."
                    lines.append(f"{series} {key}={value} {NS + t * 1_000}")
    return lines


def _points(lines: list[str]) -> dict[tuple, dict[str, object]]:
    """The points of measurement 'sensor', each field's value from its last line: a reader written apart."""
    points: dict[tuple, dict[str, object]] = {}
    for line in lines:
        series, pairs, stamp = line.rsplit(" ", 2)
        measurement, *tags = series.replace("\\ ", "\x00").split(",")
        if measurement != "sensor":
            continue
        point = points.setdefault((tuple(sorted(t.replace("\x00", " ") for t in tags)), int(stamp)), {})
        for pair in pairs.split(","):
            key, value = pair.split("=", 1)
            point[key] = (value[1:-1] if value.startswith('"') else int(value[:-1]) if value.endswith("i")
                          else value in ("t", "T") if key == "ok" else float(value))
    return points


@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=_tsm_export(), chunk=st.sampled_from([150, 700, 1 << 20]))
def test_export_of_one_line_per_field_reads_as_its_points(tmp_path: Path, monkeypatch, lines: list[str],
                                                          chunk: int) -> None:
    """The compiled reader joins a point's lines where a series' field runs share their times, and the
    merge sorts only the series whose runs overlap; both readers must give every point once, with
    the value of the last line of each field, whatever the chunks cut."""
    path = tmp_path / "export.lp"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = _points(lines)
    with monkeypatch.context() as patch:
        patch.setattr(line_protocol, "_CHUNK_BYTES", chunk)
        compiled = _read(path)
        patch.setattr(line_protocol, "_lineproto", None)
        arrow = _read(path)
    if not expected:
        assert compiled == arrow == "no rows"
        return
    assert compiled.equals(arrow), (compiled.to_pylist(), arrow.to_pylist())
    tags = [name for name in compiled.column_names if name in ("device_id", "site")]
    got = {(tuple(sorted(f"{t}={row[t]}" for t in tags if row[t] is not None)), stamp):
           {key: row[key] for key in _TSM_FIELDS if row.get(key) is not None}
           for row, stamp in zip(compiled.to_pylist(), compiled["time"].cast(pa.int64()).to_pylist(), strict=True)}
    assert len(got) == compiled.num_rows == len(expected)
    assert got == expected


def test_a_time_the_first_run_lacks_is_one_row_for_every_later_field(tmp_path: Path) -> None:
    lines = ["sensor,device_id=d0 value=1.5 1000", "sensor,device_id=d0 value=2.5 3000",
             "sensor,device_id=d0 count=1i 1000", "sensor,device_id=d0 count=2i 2000", "sensor,device_id=d0 count=3i 3000",
             'sensor,device_id=d0 state="a" 2000', 'sensor,device_id=d0 state="b" 3000']
    path = tmp_path / "export.lp"
    path.write_text("\n".join(lines) + "\n")
    assert line_protocol._lineproto.split(path.read_bytes(), 0)[15] == 4  # only time 2000 needed a second row
    assert _read(path).to_pydict() == {
        "count": [1, 2, 3], "device_id": ["d0"] * 3, "state": [None, "a", "b"],
        "time": pa.array([1000, 2000, 3000], pa.timestamp("ns", "UTC")).to_pylist(),
        "value": [1.5, None, 2.5]}


def test_joined_lines_keep_their_own_line_numbers_in_errors(tmp_path: Path) -> None:
    """A line joined to an earlier line's row is still named by its own number."""
    lines = ["sensor,device_id=d0 value=1 1", "sensor,device_id=d0 value=2 2",
             "sensor,device_id=d0 count=1i 1", "sensor,device_id=d0 count=2i 2",
             "sensor,device_id=d1 count=1.5 1"]
    path = tmp_path / "export.lp"
    path.write_text("\n".join(lines) + "\n")
    assert line_protocol._lineproto.split(path.read_bytes(), 0)[15] == 2  # lines 3 and 4 joined rows 1 and 2
    assert _read(path) == (f"InfluxError: field 'count' of measurement 'sensor' has two types in {path}: "
                           "integer at line 3 and float at line 5")


def test_the_first_bad_timestamp_is_named_whatever_its_fault(tmp_path: Path) -> None:
    path = tmp_path / "export.lp"
    path.write_text(f"sensor value=1 {NS}\nsensor value=1 12x\nsensor value=1\n")
    assert _read(path) == f"InfluxError: line 2 of {path}: bad timestamp: 'sensor value=1 12x'"


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(lines=st.lists(st.sampled_from(["a", "ab", "a b", "a,x=1", "", "a,x=1 f=1 2", "a,x=1 g=1 3", "b f=1 1",
                                       "a,x=1 f=2 3", " x", "a,x=1  f"]), min_size=1, max_size=40))
def test_chunks_are_cut_alike_with_or_without_the_compiled_reader(lines: list[str]) -> None:
    """Both readers cut chunks before the last series' run of lines (when it is in the second half),
    so they read a file in the same chunks."""
    block = bytearray(("\n".join(lines) + "\n").encode())
    compiled = line_protocol._series_tail(block, len(block))
    assert line_protocol._lineproto is not None
    try:
        saved, line_protocol._lineproto = line_protocol._lineproto, None
        assert line_protocol._series_tail(block, len(block)) == compiled
    finally:
        line_protocol._lineproto = saved
    assert compiled == len(block) or block[compiled - 1:compiled] == b"\n" and compiled > len(block) // 2


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(lines=st.lists(st.sampled_from(["a,x=1 f=1 1", "a,x=1 g=1 1", "b f=1 1", "", "  ", "\t", "a" * 70,
                                       "a,x=1 f=1 " + "9" * 40]), max_size=60),
       end=st.sampled_from(["\n", "", " "]), size=st.sampled_from([16, 50, 64, 200]), tail=st.booleans())
def test_a_mapped_file_is_cut_into_the_chunks_of_its_stream(tmp_path_factory, lines: list[str], end: str, size: int,
                                                             tail: bool) -> None:
    """A local export is read through a memory map, a compressed or remote one as a stream; both must
    be cut into the same chunks (blank ones too, whose lines count), whatever the line lengths."""
    data = ("\n".join(lines) + end).encode()
    if not data:
        return
    path = tmp_path_factory.mktemp("mapped") / "export.lp"
    path.write_bytes(data)
    cut = line_protocol._series_tail if tail else None
    streamed = [bytes(chunk) for chunk in base._line_chunks(pa.BufferReader(data), size, cut, blank=True)]
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        views = list(base._mapped_line_chunks(mapped, size, cut))
        chunks = [view.tobytes() for _, view in views]
        starts = [start for start, _ in views]
        for _, view in views:
            view.release()
    assert chunks == streamed
    assert b"".join(chunks) == data
    assert starts == [sum(map(len, chunks[:i])) for i in range(len(chunks))]


@pytest.mark.parametrize("suffix", [".lp", ".lp.gz"])
def test_lines_after_a_chunk_of_blank_lines_keep_their_numbers(tmp_path: Path, monkeypatch, suffix: str) -> None:
    """A chunk holding only blank lines is still counted: the first bad line after it is named by its
    own number, whether the file is mapped or streamed through gzip."""
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 64)
    text = f"sensor value=1 {NS}\n" + "\n" * 200 + f"sensor value=2 {NS + 1}\nsensor value=3i {NS + 2}\n"
    path = tmp_path / f"export{suffix}"
    with (gzip.open(path, "wt") if suffix.endswith(".gz") else path.open("w")) as f:
        f.write(text)
    assert _read(path) == (f"InfluxError: field 'value' of measurement 'sensor' has two types in {path}: "
                           "float at line 1 and integer at line 203")


def test_a_mapped_export_lets_go_of_the_pages_it_has_read(tmp_path: Path, monkeypatch) -> None:
    """A mapped file's pages count in the process's memory (RssFile) while mapped; the reader lets
    go of each chunk's pages once it is parsed, so reading a file larger than a few chunks does not
    grow the process by the file's size."""
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 1 << 20)
    path = tmp_path / "export.lp"
    path.write_text("".join(f"sensor,device_id=d{i % 50},site=north value=12.5,count={i}i {NS + i}\n"
                            for i in range(800_000)))
    assert path.stat().st_size > 48 << 20
    before = _rss_file()
    most = before
    for batch in open_influx_files(str(path), "sensor", "ns", 100_000).batches():
        most = max(most, _rss_file())
        assert batch.data.num_rows
    size = path.stat().st_size >> 20
    assert most - before < 12 << 20, f"{(most - before) >> 20} MB of the {size} MB file stayed mapped"


def test_a_chunk_that_fails_fails_the_read_without_leaving_later_chunks_waiting(tmp_path: Path, monkeypatch) -> None:
    """Each thread waits for the line count of the chunk before its own: a cut that fails before it
    counts must fail those after it too, and the read must end with the error rather than hang."""
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 4_096)
    path = tmp_path / "export.lp"
    path.write_text("".join(f"sensor value={i} {NS + i}\n" for i in range(5_000)))
    cut = line_protocol._lineproto.split
    calls = iter(range(1_000))

    def fails_third(*args):
        if next(calls) == 2:
            raise MemoryError("cutting chunk 3")
        return cut(*args)

    monkeypatch.setattr(line_protocol._lineproto, "split", fails_third)
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: outcome.append(pytest.raises(MemoryError, _read, path).value), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "the read hangs"
    assert str(outcome[0]) == "cutting chunk 3"


def test_a_mapped_export_cut_short_while_it_is_read_is_named(tmp_path: Path, monkeypatch) -> None:
    """Pages of a mapped file past its new end cannot be read at all (the process would stop), so a
    file cut short while it is read is an error that says so before the next chunk is handed on."""
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 4_096)
    path = tmp_path / "export.lp"
    path.write_text("".join(f"sensor value={i} {NS + i}\n" for i in range(20_000)))
    size = path.stat().st_size
    parser = line_protocol.LineProtocol("sensor", "ns", str(path))
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # unmapped with the error's views
    batches = parser.batches(mapped)
    assert next(batches).num_rows
    with path.open("r+b") as cut:
        cut.truncate(size - 1)  # the last page stays: chunks already handed on read on safely
    with pytest.raises(line_protocol.InfluxError) as error:
        list(batches)
    assert str(error.value) == f"{path} was cut short while it was read: {size - 1:,} bytes of {size:,}"


def _rss_file() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssFile:"))) << 10
