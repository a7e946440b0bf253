"""InfluxDB sources against a real influxd 1.x: a live database and its line-protocol export files."""

from __future__ import annotations

import csv
import gzip
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

import timelake
from tests.conftest import recent
from tests.sources.conftest import Influx, assert_nothing_staged, cli, error_line, free_port, job_error
from timelake.model.spec import JobSpec
from timelake.sources import influx as source_influx
from timelake.sources import line_protocol
from timelake.sources.base import SourceError
from timelake.steps.scan import open_job_source

SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("site", pa.string()),
                    ("value", pa.float64()), ("count", pa.int64()), ("state", pa.string()), ("ok", pa.bool_())])
ORDER = [("device_id", "ascending"), ("ts", "ascending")]
# Day 0 is written in seconds, day 1 in milliseconds, days 2-3 are a gap, day 4 in nanoseconds.
DAYS = {0: ("s", timedelta(0)), 1: ("ms", timedelta(milliseconds=250)), 4: ("ns", timedelta(microseconds=123_456))}
EXPORT_HEADER = """# INFLUXDB EXPORT: 1677-09-21T00:12:43Z - 2262-04-11T23:47:16Z
# DDL
CREATE DATABASE hist WITH NAME autogen
# DML
# CONTEXT-DATABASE:hist
# CONTEXT-RETENTION-POLICY:autogen
# writing tsm data
"""


def _points() -> tuple[pa.Table, dict[str, list[str]], list[str]]:
    """The expected rows; the same points as line protocol per write precision (plus another measurement);
    and as an export writes them: one line per field, in runs per series and field, times in ns."""
    start = datetime.fromisoformat(recent(10)).replace(tzinfo=timezone.utc)
    rows, lines, export = [], {unit: [] for unit, _ in DAYS.values()}, []
    for day, (unit, extra) in DAYS.items():
        for hour in range(0, 24, 3):
            for i, device in enumerate(["d00", "d01", "d02"]):
                ts = start + timedelta(days=day, hours=hour) + extra
                site, site_lp = ("north wing", r"north\ wing") if i == 1 else ("south", "south")
                state, state_lp = ('ok, "fine"', r'"ok, \"fine\""') if hour == 6 else ("idle", '"idle"')
                value, count, ok = round(day * 100 + hour + i / 4, 2), hour * 10 + i, hour % 2 == 0
                rows.append({"ts": ts, "device_id": device, "site": site, "value": value, "count": count,
                             "state": state, "ok": ok})
                ns = (int(ts.timestamp()) * 10**9 + ts.microsecond * 1000 + (789 if unit == "ns" else 0))
                stamp = ns // {"s": 10**9, "ms": 10**6, "ns": 1}[unit]
                series = f"sensor,device_id={device},site={site_lp}"
                fields = {"value": value, "count": f"{count}i", "state": state_lp, "ok": "t" if ok else "FALSE"}
                lines[unit].append(f"{series} {','.join(f'{k}={v}' for k, v in fields.items())} {stamp}")
                lines[unit].append(f"other,device_id={device} value=1 {stamp}")
                export += [(series, key, f"{series} {key}={v} {ns}") for key, v in fields.items()]
                export.append(("other", "value", f"other,device_id={device} value=1 {ns}"))
    export.sort(key=lambda entry: entry[:2])  # stable: time order within each run
    return pa.Table.from_pylist(rows, schema=SCHEMA).sort_by(ORDER), lines, [line for *_, line in export]


def _table(lake: timelake.Lake) -> timelake.Table:
    return lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                             partition_by="day", retention="P3Y")


def _rows(lake: timelake.Lake) -> pa.Table:
    return lake.table("iot.sensor").to_arrow().cast(SCHEMA).sort_by(ORDER)


def test_live_server_backfill_reads_each_day_and_equals_the_written_points(lake, influxd: Influx, monkeypatch):
    expected, lines, _ = _points()
    influxd.query("CREATE DATABASE hist")
    for unit, unit_lines in lines.items():
        influxd.write("hist", "\n".join(unit_lines), unit)
    _table(lake)
    uri = f"{influxd.endpoint.replace('http', 'influx')}/hist?measurement=sensor"
    spec = JobSpec(table="iot.sensor", source=uri, map={"ts": "time"})

    src = open_job_source(spec)
    assert len(src.pieces()) == 3  # one per day with points: the gap costs no query
    monkeypatch.setattr(source_influx, "_QUERY_CHUNK_ROWS", 5)  # a day's points arrive in several chunks
    reopened = [open_job_source(spec) for _ in src.pieces()]  # as workers do: a fresh source per piece
    per_piece = [pa.Table.from_batches([b.data for b in s.batches(p)]) for s, p in zip(reopened, src.pieces(), strict=True)]
    assert [t.num_rows for t in per_piece] == [24, 24, 24]

    other = open_job_source(spec.model_copy(update={"source": uri.replace("=sensor", "=other")}))
    points = pa.Table.from_batches([b.data for b in other.batches()])  # no string field: read as CSV, not JSON
    assert points.schema.names == ["time", "device_id", "value"] and set(points["value"].to_pylist()) == {1.0}
    assert sorted(pa.compute.floor_temporal(points["time"], unit="microsecond").cast(expected["ts"].type).to_pylist()) \
        == sorted(expected["ts"].to_pylist())

    dry = lake.submit(JobSpec(table="iot.sensor", source=uri, map={"ts": "time"}, dry_run=True), wait=True).wait().report()
    assert {k: dry["source_limits"][k] for k in ("max_connections", "rows_per_second")} == \
        {"max_connections": 2, "rows_per_second": 250_000}  # a live server keeps serving: the database defaults
    report = lake.submit(spec, wait=True).wait().report()
    assert report["phase"] == "published" and report["rows_written"] == expected.num_rows
    assert _rows(lake).equals(expected)
    assert [g["days"] for g in report["source_gaps"]] == [2]
    assert "password" in str(pytest.raises(SourceError, open_job_source, spec.model_copy(
        update={"source": uri.replace("//", "//reader:secret@")})).value)


def test_export_files_plain_and_gzip_give_the_same_table(tmp_path: Path, lake, warehouse):
    expected, _, export = _points()
    body = EXPORT_HEADER + "\n".join(export) + "\n"
    (tmp_path / "hist.lp").write_text(body)
    with gzip.open(tmp_path / "hist.lp.gz", "wt") as f:
        f.write(body)

    _table(lake)
    report = lake.submit(JobSpec(table="iot.sensor", source=str(tmp_path / "hist.lp"), map={"ts": "time"}),
                         wait=True).wait().report()
    assert report["rows_in_source"] == expected.num_rows  # the other measurement and the headers are not rows
    assert _rows(lake).equals(expected)

    other = tmp_path / "other-lake"
    _table(timelake.connect(warehouse=other))
    result = cli("backfill", "iot.sensor", "--from", str(tmp_path / "hist.lp.gz"), "--map", "ts=time",
                 "--measurement", "sensor", "--json", warehouse=other)
    assert result.returncode == 0, result.stderr
    assert _rows(timelake.connect(warehouse=other)).equals(expected)


def test_precision_of_an_export_file(tmp_path: Path, lake):
    expected, lines, _ = _points()
    (tmp_path / "seconds").write_text("\n".join(lines["s"]) + "\n")  # no extension: --format influx says what it is
    _table(lake)
    spec = JobSpec(table="iot.sensor", source=str(tmp_path / "seconds"), format="influx", precision="s",
                   map={"ts": "time"})
    lake.submit(spec, wait=True).wait()
    day0 = expected.filter(pa.compute.less(expected["ts"], expected["ts"][0].as_py() + timedelta(days=1)))
    assert day0.num_rows == 24 and _rows(lake).equals(day0.sort_by(ORDER))


@pytest.mark.parametrize(("lines", "message", "via_cli"), [
    (["sensor,device_id=d00 value=1.5 1000000000000000000", "other value=1i 1000000000000000000",
      "sensor,device_id=d01 value=2i 1000000000000000000"],
     "field 'value' of measurement 'sensor' has two types in {file}: float at line 1 and integer at line 3", True),
    (["sensor,device_id=d00 value=1.5 1000000000000000000", "sensor,device_id=d00 1000000000000000000"],
     "line 2 of {file}: invalid field format: 'sensor,device_id=d00 1000000000000000000'", False),
    (["sensor,device_id=d00 value=1.5"], "line 1 of {file}: no timestamp (influxd would stamp the point", False),
])
def test_bad_export_file_is_one_clear_line_and_nothing_is_staged(tmp_path, lake, warehouse, lines, message, via_cli):
    table = _table(lake)
    expected, *_ = _points()
    table.append(expected.slice(0, 5))
    main = table.refresh().iceberg.current_snapshot().snapshot_id
    file = tmp_path / "bad.lp"
    file.write_text("\n".join(lines) + "\n")
    if via_cli:
        error = error_line(cli("backfill", "iot.sensor", "--from", str(file), "--map", "ts=time", warehouse=warehouse))
    else:
        error = job_error(lake, table="iot.sensor", source=str(file), map={"ts": "time"})
    assert message.format(file=file) in error
    assert_nothing_staged(lake, "iot.sensor", main)


def test_server_errors_are_one_clear_line_and_nothing_is_staged(lake, warehouse, influxd: Influx):
    table = _table(lake)
    expected, *_ = _points()
    table.append(expected.slice(0, 5))
    main = table.refresh().iceberg.current_snapshot().snapshot_id
    influxd.query("CREATE DATABASE mixed")
    influxd.write("mixed", "sensor,device_id=d00 value=1i 1000000000", "s")
    influxd.write("mixed", "sensor,device_id=d00 value=1.5 1100000000", "s")  # another shard accepts a float
    base = influxd.endpoint.replace("http", "influx")
    unreachable = f"influx://127.0.0.1:{free_port()}/hist?measurement=sensor"
    assert "cannot reach InfluxDB at http://127.0.0.1:" in error_line(
        cli("backfill", "iot.sensor", "--from", unreachable, "--map", "ts=time", warehouse=warehouse))
    cases = {
        f"{base}/mixed?measurement=nope": "measurement 'nope' is not in InfluxDB database 'mixed'",
        f"{base}/nodb?measurement=sensor": "InfluxDB database 'nodb' at",
        f"{base}/mixed?measurement=sensor": "field 'value' of measurement 'sensor' has two types in database 'mixed'",
    }
    for uri, message in cases.items():
        assert message in job_error(lake, table="iot.sensor", source=uri, map={"ts": "time"})
    assert_nothing_staged(lake, "iot.sensor", main)


def _read_any(path: Path, fmt: str = "influx") -> pa.Table:
    src = open_job_source(JobSpec(table="iot.sensor", source=str(path), map={"ts": "time"}, format=fmt))
    return pa.Table.from_batches([b.data for b in src.batches()])


def _read(path: Path) -> pa.Table:
    return _read_any(path).select(["time", "device_id", "site", "value", "count", "state", "ok"])


def test_small_chunks_read_the_same_points_and_later_lines_win(tmp_path: Path, monkeypatch):
    _, _, export = _points()
    first = next(i for i, line in enumerate(export) if line.startswith("sensor") and " count=" in line)
    series, _, stamp = export[first].split(" ")
    rewritten = f"{series} count=999i {stamp}"  # the same point again, as a WAL line after the TSM data
    (tmp_path / "e.lp").write_text(EXPORT_HEADER + "\n".join([*export, rewritten]) + "\n")
    whole = _read(tmp_path / "e.lp").sort_by([("device_id", "ascending"), ("time", "ascending")])
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 300)  # many chunks: runs of one field span several
    assert _read(tmp_path / "e.lp").sort_by([("device_id", "ascending"), ("time", "ascending")]).equals(whole)
    monkeypatch.setattr(line_protocol, "_HOLD_BYTES", 2_000)  # lines spilled to disk by time, merged part by part
    assert _read(tmp_path / "e.lp").sort_by([("device_id", "ascending"), ("time", "ascending")]).equals(whole)
    assert whole.num_rows == 72 and whole["count"].to_pylist().count(999) == 1

    (tmp_path / "mixed.lp").write_text("\n".join([*export, f"{series} count=1.5 {stamp}"]) + "\n")
    with pytest.raises(line_protocol.InfluxError,
                       match=rf"field 'count' .* integer at line {first + 1} and float at line {len(export) + 1}"):
        _read(tmp_path / "mixed.lp")


def test_both_readers_give_one_table_whatever_each_sets_aside(tmp_path: Path, monkeypatch):
    """Chunks go through the compiled reader or, without it, Arrow's CSV reader; each reads the plain
    lines itself and sets the others aside for the port of influxd's parser (an escape, a second
    space; a value spelled ``5.`` only the compiled one). Whatever each sets aside, the table is the same; a key cannot be
    a tag on one line and a field on another, and a Windows line end is refused, as influxd does."""
    assert line_protocol._lineproto is not None, "the install did not build timelake/sources/_lineproto.c"
    ns = 1_700_000_000_000_000_000
    lines = [f"sensor,device_id=d{i % 3:02d},site=north value={i / 4},count={i}i {ns + i}" for i in range(30)]
    lines += [f"sensor,device_id=d{i % 3:02d},site=north state=\"s {i}, x=1\" {ns + i}" for i in range(30)]  # same points
    lines += [f"sensor,device_id=d{i % 3:02d},site=north {f'level={i}u' if i % 2 else 'ok=FALSE'} {ns + i}"
              for i in range(30)]  # one shape, two keys
    lines += ["sensor,device_id=d02 site=4i,value=9.5 1700000000000000999",  # 'site' a field here
              "sensor,device_id=d02,site=west  value=1.25 1700000000000000999",  # two spaces: set aside
              f"sensor,device_id=d01,site=north value=5. {ns + 1}"]  # read by influxd, set aside by both readers
    lines.insert(30, f'sensor,site=north,device_id=d00 note="say \\"hi\\"" {ns}')  # an escape; tags in another order
    path = tmp_path / "plain.lp"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 400)
    order = [("device_id", "ascending"), ("time", "ascending")]
    aside, real = [], line_protocol._aside

    def noting(chunk, cut, final):
        found = real(chunk, cut, final)
        aside.extend(bytes(chunk[start:end]) for _, start, end in found.blocks)
        return found

    monkeypatch.setattr(line_protocol, "_aside", noting)

    def read() -> pa.Table:
        return _read_any(path, "influx2").sort_by(order)

    with pytest.raises(line_protocol.InfluxError, match=f"'site' of measurement 'sensor' is a tag at line 1 and a field "
                                                        f"at line 92 in {path}: a table column is one or the other"):
        read()
    lines[-3] = "sensor,device_id=d02 other=4i,value=9.5 1700000000000000999"
    path.write_text("\n".join(lines) + "\n")
    aside.clear()
    compiled = read()
    compiled_aside = sorted(aside)
    aside.clear()
    monkeypatch.setattr(line_protocol, "_lineproto", None)  # as installed without a compiler, or on Lambda
    arrow = read()
    assert compiled_aside == sorted(line.encode() for line in (lines[30], lines[-2], lines[-1]))
    assert sorted(aside) == sorted(line.encode() for line in (lines[30], lines[-2]))  # the Arrow reader reads 5.
    assert arrow.equals(compiled)
    assert arrow.num_rows == 32 and sorted(arrow["value"].to_pylist()[-2:]) == [1.25, 9.5]
    assert arrow["count"].to_pylist()[:3] == [0, 3, 6] and arrow["state"].null_count == 2
    assert arrow["state"][0].as_py() == "s 0, x=1"
    assert 5.0 in arrow["value"].to_pylist() and 0.25 not in arrow["value"].to_pylist()  # the later line of the point
    assert arrow["ok"].null_count == 17 and arrow["level"].type == pa.uint64() and arrow["level"][1].as_py() == 3
    assert arrow["note"].to_pylist()[0] == 'say "hi"' and arrow["note"].null_count == 31

    path.write_text("\n".join(lines[:2]) + "\r\n")
    with pytest.raises(line_protocol.InfluxError, match=rf"line 2 of .*: bad timestamp: '{lines[1]}\\r'"):
        read()


def test_lines_set_aside_keep_their_numbers_and_a_key_cannot_change_sides(tmp_path: Path, monkeypatch):
    """A comment, an escaped space or a bad line amid thousands of plain ones is read (or named) by the
    port of influxd's parser with its own line number; a key that is a tag in one chunk and a field in
    a later one is an error, not a column of two meanings."""
    ns = 1_700_000_000_000_000_000
    lines = [f"sensor,device_id=d{i % 7},site=north value={i}.5 {ns + i}" for i in range(3_000)]
    lines[1_000] = "# a comment in the middle"
    lines[1_001] = rf"sensor,device_id=d0,site=north\ wing value=2.5 {ns + 1_001}"
    path = tmp_path / "e.lp"

    def read(body: list[str]) -> pa.Table:
        path.write_text("\n".join(body) + "\n")
        return _read_any(path)

    table = read(lines)
    assert table.num_rows == 2_999 and set(table["site"].to_pylist()) == {"north", "north wing"}
    bad = lines.copy()
    bad[2_000] = f"sensor,device_id=d1 {ns}"
    with pytest.raises(line_protocol.InfluxError, match=r"line 2001 of .*: invalid field format: 'sensor,device_id=d1 "):
        read(bad)
    bad[2_000] = "sensor,device_id=d1,site=north value=1.5"
    with pytest.raises(line_protocol.InfluxError, match=r"line 2001 of .*: no timestamp \(influxd would stamp"):
        read(bad)
    monkeypatch.setattr(line_protocol, "_CHUNK_BYTES", 1_000)
    with pytest.raises(line_protocol.InfluxError, match="'site' of measurement 'sensor' is a tag at line 1 and a field "
                                                        "at line 3001"):
        read([*lines, f"sensor,device_id=d1 site=1.5 {ns}"])


def test_rejecting_an_export_loads_the_rest_and_counts_each_line_influxd_refuses(tmp_path: Path, lake, warehouse):
    """With --on-bad-value reject the lines InfluxDB would refuse are left out and counted, with examples
    that name each line and why; the points of the other lines are published and the rows balance."""
    expected, _, export = _points()
    bad = ["sensor,device_id=d00 value=1u 1000000000000000000", "sensor,device_id=d00,device_id=d01 value=1 1",
           "sensor,device_id=d09 value=1 99999999999999999999", f"sensor,device_id=d00 count=1.5 {10**18}",
           'sensor,device_id=d09 state="open 1000000000000000000']  # last: its quote would run over the lines after it
    path = tmp_path / "bad.lp"
    path.write_text(EXPORT_HEADER + "\n".join([*export, *bad]) + "\n")
    first = EXPORT_HEADER.count("\n") + len(export) + 1
    _table(lake)
    strict = job_error(lake, table="iot.sensor", source=str(path), map={"ts": "time"})
    assert strict.endswith(f"line {first} of {path}: invalid number (unsigned integers such as 1u are InfluxDB 2.x line "
                           "protocol: read it with --format influx2): 'sensor,device_id=d00 value=1u 1000000000000000000'")
    result = cli("backfill", "iot.sensor", "--from", str(path), "--map", "ts=time", "--on-bad-value", "reject", "--json",
                 warehouse=warehouse)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["phase"] == "published" and report["rows_rejected"]["reasons"] == {"bad_line": 5}, report
    assert report["rows_in_source"] == expected.num_rows + 5 and report["rows_written"] == expected.num_rows
    examples = report["rows_rejected"]["examples"]["bad_line"].split(" | ")
    assert [example.split(":")[0] for example in examples] == [f"line {first + i} of {path}" for i in range(5)]
    assert "duplicate tags" in examples[1] and "value out of range" in examples[2] and "unbalanced quotes" in examples[4]
    assert "field 'count' is integer on an earlier line and float here" in examples[3]
    assert _rows(lake).equals(expected)


def _annotated(table: pa.Table, other: int) -> str:
    """The points as ``influx query --raw`` prints them: a table per series and field (its own annotations
    when the value's type changes), values of another measurement between them, CRLF line ends."""
    kinds = {"value": "double", "count": "long", "state": "string", "ok": "boolean"}
    blocks: list[list[list[str]]] = []
    number = 0
    start, stop = "2020-01-01T00:00:00Z", "2030-01-01T00:00:00Z"
    for field, datatype in kinds.items():
        rows = []
        for (device, site), group in sorted(_by_series(table).items()):
            for row in group:
                value = row[field]
                text = ("true" if value else "false") if datatype == "boolean" else repr(value) if datatype == "double" \
                    else str(value)
                stamp = row["ts"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                rows.append(["", "", str(number), start, stop, stamp, text, field, "sensor", device, site])
            number += 1
        rows += [["", "", str(number + i), start, stop, "2026-01-01T00:00:00Z", {"string": "x", "boolean": "true"}.get(datatype, "1"), field,
                  "other", f"d{i}", "x"] for i in range(other)]
        number += other
        blocks.append([["#group", "false", "false", "true", "true", "false", "false", "true", "true", "true", "true"],
                       ["#datatype", "string", "long", "dateTime:RFC3339", "dateTime:RFC3339", "dateTime:RFC3339Nano",
                        datatype, "string", "string", "string", "string"],
                       ["#default", "_result", "", "", "", "", "", "", "", "", ""],
                       ["", "result", "table", "_start", "_stop", "_time", "_value", "_field", "_measurement", "device_id",
                        "site"], *rows])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    for block in blocks:
        writer.writerows(block)
        out.write("\r\n")
    return out.getvalue()


def _by_series(table: pa.Table) -> dict[tuple[str, str], list[dict]]:
    found: dict[tuple[str, str], list[dict]] = {}
    for row in table.to_pylist():
        found.setdefault((row["device_id"], row["site"]), []).append(row)
    return found


def test_annotated_csv_of_influx_query_reads_as_the_points(tmp_path: Path, lake, warehouse):
    """The annotated CSV of ``influx query --raw`` (found by its first row, as the file is a .csv) gives
    the same table as the points themselves: a table per series and field merged into one row a point,
    each field typed by its #datatype, quoted values with commas and quotes read whole."""
    expected, _, _ = _points()
    path = tmp_path / "query.csv"
    path.write_text(_annotated(expected, other=2), newline="")
    _table(lake)
    src = open_job_source(JobSpec(table="iot.sensor", source=str(path), map={"ts": "time"}))
    assert isinstance(src, source_influx.InfluxFileSource) and src.kind == "influx-csv"
    assert src.schema().names == ["time", "device_id", "site", "count", "ok", "state", "value"]
    result = cli("backfill", "iot.sensor", "--from", str(path), "--map", "ts=time", "--json", warehouse=warehouse)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows_written"] == expected.num_rows
    assert _rows(lake).equals(expected)

    pivoted = tmp_path / "pivoted.csv"  # pivot(): a column per field, the group key's columns the tags
    pivoted.write_text("#group,false,false,true,false,false,true\n#datatype,string,long,string,dateTime:RFC3339,double,string\n"
                       "#default,_result,,,,,\n,result,table,_measurement,_time,value,device_id\n"
                       ",,0,sensor,2026-01-01T00:00:00Z,1.5,d00\n,,0,sensor,2026-01-01T00:00:01Z,,d00\n")
    table = pa.Table.from_batches([b.data for b in open_job_source(JobSpec(
        table="iot.sensor", source=str(pivoted), map={"ts": "time"}, format="influx-csv")).batches()])
    assert table.to_pydict()["value"] == [1.5, None] and table["device_id"].to_pylist() == ["d00", "d00"]


@pytest.mark.parametrize(("lines", "message"), [
    ([",,0,2026-01-01T00:00:00Z,1.5,value,sensor", ",,0,2026-01-01T00:00:01Z,abc,value,sensor"],
     "line 6 of {file}: _value 'abc' is not a float"),
    ([",,0,2026-01-01 00:00:00,1.5,value,sensor"], "line 5 of {file}: _time '2026-01-01 00:00:00' is not an RFC 3339 time"),
])
def test_annotated_csv_rows_that_cannot_be_read_are_named_or_rejected(tmp_path: Path, lines: list[str], message: str):
    path = tmp_path / "bad.csv"
    path.write_text("#group,false,false,false,false,true,true\n#datatype,string,long,dateTime:RFC3339,double,string,string\n"
                    "#default,_result,,,,,\n,result,table,_time,_value,_field,_measurement\n" + "\n".join(lines) + "\n")
    with pytest.raises(line_protocol.InfluxError) as error:
        list(source_influx.open_influx_files(str(path), "sensor", None, 100, "influx-csv").batches())
    assert str(error.value) == message.format(file=path)
    batches = list(source_influx.open_influx_files(str(path), "sensor", None, 100, "influx-csv", reject=True).batches())
    assert sum(b.rejected for b in batches) == 1 and batches[-1].examples == (message.format(file=path),)
    assert sum(b.data.num_rows for b in batches) == len(lines) - 1
    failed = tmp_path / "failed.csv"
    failed.write_text('#datatype,string,string\n#group,true,true\n#default,,\n,error,reference\n,"bucket ""x"" not found",\n')
    with pytest.raises(line_protocol.InfluxError, match=r'line 5 of .*: the query failed: bucket "x" not found'):
        list(source_influx.open_influx_files(str(failed), "sensor", None, 100, "influx-csv").batches())


def test_influxdb_2_export_lp_reads_unsigned_integers(tmp_path: Path):
    """``influxd inspect export-lp`` writes line protocol of InfluxDB 2.x, where ``1u`` is an unsigned
    integer; read as 2.x its fields are uint64, and its parser refuses the tag keys 2.x reserves."""
    path = tmp_path / "export.lp"
    path.write_text("sensor,device_id=d0 level=18446744073709551615u 1000\nsensor,device_id=d0 level=3u 2000\n")
    table = _read_any(path, "influx2")
    assert table["level"].type == pa.uint64() and table["level"].to_pylist() == [2**64 - 1, 3]
    path.write_text("sensor,_field=x level=3u 1000\n")
    with pytest.raises(line_protocol.InfluxError, match=r"line 1 of .*: cannot use reserved tag key \"_field\""):
        _read_any(path, "influx2")
