"""Coverage: every bucket's status, rows and writer match an independent computation over the data;
the metadata view opens no data file; the companion table is the completion signal readers join."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

import timelake
from tests.conftest import cli, recent, stage_job
from timelake.adapters.objects import forget_shared_io
from timelake.followup import heatmap
from timelake.followup.coverage import EXPECTED_INTERVAL, EXPECTED_SERIES
from timelake.steps.publish import publish
from timelake.steps.validate import validate
from datetime import UTC

DEVICES, PER_DAY = 3, 72  # make_readings: hourly rows per device


@pytest.fixture
def scene(lake, sensor, readings):
    """Live days, a gap, a partial day, a published backfill and a staged (leased, unpublished) job.

    Returns the table and a labelled record of every row the test wrote (ts, writer)."""
    with sensor.iceberg.transaction() as tx:
        tx.set_properties({EXPECTED_INTERVAL: "PT1H", EXPECTED_SERIES: str(DEVICES)})
    written = []

    def live(start: str, days: float) -> None:
        rows = readings(start, days=days, devices=DEVICES, seed=len(written))
        sensor.append(rows)
        written.append(_labelled(rows, "live"))

    live(recent(20), 5)          # recent(20) .. recent(16) complete
    # recent(15) .. recent(13): a gap
    live(recent(12), 0.5)        # recent(12): a partial day
    source = readings(recent(11), days=2, devices=DEVICES, seed=99)
    job = sensor.backfill(source=source).wait()
    written.append(_labelled(source, job.id))
    live(recent(9), 2)
    live(recent(5), 1)           # live rows inside the range the staged job is about to lease
    staged = stage_job(lake, readings(recent(6), days=2, devices=DEVICES, seed=7))
    return {"table": sensor.refresh(), "written": pa.concat_tables(written), "published": job.id, "staged": staged}


def _labelled(rows: pa.Table, writer: str) -> pa.Table:
    return pa.table({"ts": rows.column("ts"), "writer": pa.array([writer] * rows.num_rows)})


def _reference(table: timelake.Table, written: pa.Table, leases: list, start: str, end: str) -> list[dict]:
    """Per day from the DATA (DuckDB over to_arrow()): rows and status; writers from what the test wrote."""
    data = table.to_arrow()  # noqa: F841 (DuckDB reads it)
    lease_ranges = pa.table({"lo": [lease.start for lease in leases], "hi": [lease.end for lease in leases]})  # noqa: F841
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con.sql(f"""
        WITH days AS (SELECT unnest(generate_series(DATE '{start}', DATE '{end}' - 1, INTERVAL 1 DAY))::DATE AS day),
        per_day AS (SELECT ts::DATE AS day, count(*) AS n FROM data GROUP BY 1),
        writers AS (SELECT ts::DATE AS day, string_agg(DISTINCT writer, ',' ORDER BY writer) AS writers FROM written GROUP BY 1),
        leased AS (SELECT DISTINCT d.day FROM days d, lease_ranges l
                   WHERE epoch_us(d.day::TIMESTAMPTZ) < l.hi AND epoch_us(d.day::TIMESTAMPTZ) + 86400000000 > l.lo)
        SELECT strftime(d.day, '%Y-%m-%d') AS bucket, coalesce(p.n, 0) AS rows, coalesce(w.writers, '') AS writers,
               CASE WHEN l.day IS NOT NULL THEN 'backfilling' WHEN p.n IS NULL THEN 'gap'
                    WHEN p.n < {PER_DAY} THEN 'partial' ELSE 'complete' END AS status
        FROM days d LEFT JOIN per_day p USING (day) LEFT JOIN writers w USING (day) LEFT JOIN leased l USING (day)
        ORDER BY d.day""").to_arrow_table().to_pylist()


def test_every_bucket_matches_the_data(lake, scene):
    table, start, end = scene["table"], recent(21), recent(3)
    cmap = table.coverage_map(start, end)
    reference = _reference(table, scene["written"], lake.leases("iot.sensor"), start, end)
    got = [{"bucket": b.label, "rows": b.rows, "writers": ",".join(sorted(b.writers)), "status": b.status}
           for b in cmap.buckets]
    assert got == reference
    statuses = {r["status"] for r in reference}
    assert statuses == {"complete", "partial", "backfilling", "gap"}  # the scene holds every kind
    by_day = {b.label: b for b in cmap.buckets}
    assert by_day[recent(11)].last_writer == scene["published"] and by_day[recent(11)].expected == PER_DAY
    assert by_day[recent(5)].backfill_jobs == [scene["staged"]] and by_day[recent(5)].last_writer == "live"
    assert not any(b.estimated for b in cmap.buckets)  # day buckets over day partitions are exact


def test_hour_and_month_buckets_match_the_data(lake, scene):
    table = scene["table"]
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    data = table.to_arrow()  # noqa: F841
    hours = table.coverage_map(recent(12), recent(11), by="hour")
    per_hour = dict(con.sql("SELECT strftime(date_trunc('hour', ts), '%Y-%m-%dT%H'), count(*) FROM data GROUP BY 1").fetchall())
    assert [(b.label, b.rows) for b in hours.buckets] == [(b.label, per_hour.get(b.label, 0)) for b in hours.buckets]
    assert [b.status for b in hours.buckets] == ["complete"] * 12 + ["gap"] * 12  # the partial day's afternoon
    months = table.coverage_map(by="month")
    per_month = dict(con.sql("SELECT strftime(ts, '%Y-%m'), count(*) FROM data GROUP BY 1").fetchall())
    assert {b.label: b.rows for b in months.buckets} == per_month


def test_series_breakdown_reads_only_the_series_key(lake, scene):
    table = scene["table"]
    with table.iceberg.transaction() as tx:
        tx.remove_properties(EXPECTED_SERIES)
    cmap = table.refresh().coverage_map(recent(21), recent(3), series=True)
    assert cmap.series_source == "seen" and cmap.expected_series == DEVICES
    data = table.to_arrow()  # noqa: F841
    expected = {(d, s): n for d, s, n in duckdb.sql(
        "SELECT strftime(timezone('UTC', ts), '%Y-%m-%d'), device_id, count(*) FROM data GROUP BY ALL").fetchall()}
    got = {(b.label, s): n for b in cmap.buckets for s, n in b.series.items()}
    assert got == expected
    assert {b.label: b.status for b in cmap.buckets}[recent(12)] == "partial"


class _CountingHandler(pafs.FileSystemHandler):
    """A local file system that records every file opened for reading (Iceberg's FileIO reads through it)."""

    def __init__(self, opened: list[str]) -> None:
        self.fs, self.opened = pafs.LocalFileSystem(), opened

    def get_type_name(self) -> str:
        return "counting"

    def equals(self, other) -> bool:
        return self is other

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        self.opened.append(path)
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        self.opened.append(path)
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


def test_metadata_view_opens_no_data_file(lake, scene, monkeypatch, warehouse):
    opened: list[str] = []
    original = PyArrowFileIO._initialize_fs

    def counting(self, scheme, netloc=None):
        fs = original(self, scheme, netloc)
        return pafs.PyFileSystem(_CountingHandler(opened)) if isinstance(fs, pafs.LocalFileSystem) else fs

    data_files = {task.file.file_path.removeprefix("file://") for task in scene["table"].iceberg.scan().plan_files()}
    monkeypatch.setattr(PyArrowFileIO, "_initialize_fs", counting)
    forget_shared_io()  # the file systems the tables share were made before the counter
    cmap = lake.table("iot.sensor").coverage_map(recent(21), recent(3))
    assert opened and all(p.endswith(".avro") or p.endswith(".metadata.json") for p in opened)  # manifests only
    assert not data_files & set(opened)
    lake.table("iot.sensor").to_arrow()  # the counter does see data reads
    assert data_files & set(opened)

    # and the view needs no data file at all: move them away, the map is the same
    hidden = warehouse.parent / "hidden"
    hidden.mkdir()
    for i, path in enumerate(data_files):
        shutil.move(path, hidden / f"{i}.parquet")
    again = timelake.connect(warehouse=warehouse).table("iot.sensor").coverage_map(recent(21), recent(3))
    assert again.to_dict() == cmap.to_dict()


def test_companion_table_follows_the_publish_flow(lake, scene, warehouse):
    table, staged = scene["table"], scene["staged"]
    reader = lake.catalog  # a plain Iceberg reader: no timelake API below except to trigger writes
    after_first = reader.load_table("iot.sensor__coverage").scan().to_arrow()
    assert {r["partition"]: r["last_writer"] for r in after_first.to_pylist()} == {
        recent(11): scene["published"], recent(10): scene["published"]}  # the first publish covered its range

    refreshed = cli("coverage", "refresh", "iot.sensor", "--json", warehouse=warehouse, check=False)
    assert refreshed.returncode == 0, refreshed.stderr
    assert json.loads(refreshed.stdout) == {"table": "iot.sensor", "coverage_table": "iot.sensor__coverage", "partitions": 16}  # recent(20) … recent(5)
    leased = {r["partition"]: r["status"] for r in reader.load_table("iot.sensor__coverage").scan().to_arrow().to_pylist()}
    assert leased[recent(5)] == leased[recent(6)] == "backfilling" and leased[recent(14)] == "gap"

    validate(lake.runtime, staged)
    publish(lake.runtime, staged)  # the publish step itself refreshes the signal
    companion = reader.load_table("iot.sensor__coverage").scan().to_arrow()  # noqa: F841
    rows = table.refresh().to_arrow()  # noqa: F841
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    # a dashboard: daily totals, but only over partitions the signal calls complete
    joined = con.sql("""
        SELECT c.partition, c.status, c.last_writer, count(r.ts) AS n, any_value(c.rows) AS signal_rows
        FROM companion c LEFT JOIN rows r ON r.ts >= c.partition_start AND r.ts < c.partition_end
        GROUP BY ALL ORDER BY c.partition""").to_arrow_table().to_pylist()
    by_partition = {r["partition"]: r for r in joined}
    assert all(r["n"] == r["signal_rows"] for r in joined)
    assert by_partition[recent(6)]["status"] == "complete" and by_partition[recent(6)]["last_writer"] == staged
    assert by_partition[recent(5)]["status"] == "complete"  # live rows there + the backfill's: whole now
    assert by_partition[recent(12)]["status"] == "partial" and by_partition[recent(14)]["status"] == "gap"
    complete_rows = con.execute("""SELECT count(*) FROM rows r JOIN companion c
        ON r.ts >= c.partition_start AND r.ts < c.partition_end WHERE c.status = 'complete'""").fetchone()[0]
    assert complete_rows == con.execute(f"SELECT count(*) FROM rows WHERE ts::DATE <> DATE '{recent(12)}'").fetchone()[0]
    assert table.coverage().num_rows == len(joined)


def test_live_append_can_update_the_signal(lake, sensor, readings):
    sensor.append(readings(recent(3), days=1, devices=2), update_coverage=True)
    signal = sensor.coverage()
    assert signal.column("partition").to_pylist() == [recent(3)]
    assert signal.column("rows").to_pylist() == [48] and signal.column("last_writer").to_pylist() == ["live"]
    assert signal.column("status").to_pylist() == ["has_data"]  # no cadence declared: rows present is all it can say


def test_cli_text_json_html_and_errors(lake, scene, warehouse, tmp_path):
    run = lambda *a: cli("coverage", *a, warehouse=warehouse, check=False)  # noqa: E731
    page = tmp_path / "coverage.html"
    text = run("iot.sensor", "--start", recent(21), "--end", recent(3), "--series", "--html", str(page))
    assert text.returncode == 0 and "legend" in text.stdout and f"gap: {recent(21)}; {recent(15)}…{recent(13)} (3); " in text.stdout
    assert f"job {scene['staged']}" in text.stdout and "3 series seen" in text.stdout
    d00 = pc.sum(pc.equal(scene["table"].to_arrow(recent(21), recent(3)).column("device_id"), "d00")).as_py()
    assert re.search(r"^\s+d00\s+([\d,]+) rows", text.stdout, re.M).group(1) == f"{d00:,}"
    assert "coverage-data" in page.read_text() and f"page: {page}" in text.stdout
    data = json.loads(run("iot.sensor", "--start", recent(21), "--end", recent(3), "--json").stdout)
    assert data["statuses"] == {"complete": 9, "partial": 1, "has_data": 0, "backfilling": 2, "gap": 6}
    assert len(data["buckets"]) == 18
    bad = run("iot.nothing")
    assert bad.returncode == 1 and bad.stderr.startswith("error: table 'iot.nothing' does not exist")
    assert len(bad.stderr.strip().splitlines()) == 1

CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if "cell" in classes and "pad" not in classes:
            self.cells.append((a.get("data-bucket"), a.get("data-status"), classes[1]))


def test_html_page_in_headless_chromium(lake, scene, tmp_path):
    assert shutil.which("chromium"), "chromium is missing: `make install` installs it"
    table, start, end = scene["table"], recent(21), recent(3)
    page = tmp_path / "coverage.html"
    page.write_text(heatmap.page(table.coverage_map(start, end)))
    dom = subprocess.run([*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=90, check=True).stdout
    assert "coverage-data" in page.read_text() and "<script src" not in page.read_text()  # standalone
    parser = _Cells()
    parser.feed(dom)  # the cells exist only after the page's script ran
    reference = _reference(table, scene["written"], lake.leases("iot.sensor"), start, end)
    assert parser.cells == [(r["bucket"], r["status"], r["status"]) for r in reference]
    shot = tmp_path / "coverage.png"
    subprocess.run([*CHROMIUM, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=900,360", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=90, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_abort_takes_backfilling_out_of_the_signal(lake, scene):
    from timelake.followup.completion import update

    update(lake.runtime, "iot.sensor")
    status = lambda: {r["partition"]: r["status"] for r in scene["table"].coverage().to_pylist()}  # noqa: E731
    assert status()[recent(6)] == status()[recent(5)] == "backfilling"
    lake.job(scene["staged"]).abort()
    assert status()[recent(6)] == "gap" and status()[recent(5)] == "complete"  # back to what main holds


def test_tiered_table_signal_follows_each_partition_grain(lake):
    """Older rows live in month (or year) partitions: the companion has one row per partition of the
    tier that holds it, and day buckets over a month partition are spread and flagged estimated."""
    from datetime import datetime, timedelta

    from tests.conftest import SCHEMA, make_readings

    table = lake.create_table("iot.tiered", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by={"P30D": "day", None: "month"}, retention="P5Y")
    now = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    source = pa.concat_tables([make_readings(now - timedelta(days=5), days=2, devices=2),
                               make_readings(now - timedelta(days=150), days=40, devices=2, step_minutes=240)])
    job = table.backfill(source=source).wait()
    data = table.to_arrow()  # noqa: F841
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    cutoff = table.contract.tier_cutoffs(now)[0]
    reference = dict(con.execute(f"""SELECT CASE WHEN epoch_us(ts) >= {cutoff} THEN strftime(ts, '%Y-%m-%d')
                                           ELSE strftime(ts, '%Y-%m') END, count(*) FROM data GROUP BY 1""").fetchall())
    signal = table.coverage().to_pylist()
    assert {r["partition"]: r["rows"] for r in signal if r["rows"]} == reference
    assert {r["last_writer"] for r in signal if r["rows"]} == {job.id}
    days = table.coverage_map(now - timedelta(days=150), now - timedelta(days=110))
    per_day = dict(con.execute("SELECT strftime(ts, '%Y-%m-%d'), count(*) FROM data GROUP BY 1").fetchall())
    assert sum(b.rows for b in days.buckets) == sum(n for d, n in per_day.items() if d in {b.label for b in days.buckets})
    assert all(b.estimated for b in days.buckets if b.rows)
    assert all(abs(b.rows - per_day.get(b.label, 0)) <= 1 for b in days.buckets)  # 12 rows/day on a regular cadence


def test_empty_table_and_bad_ranges(lake, sensor):
    assert sensor.coverage_map().buckets == [] and sensor.coverage().num_rows == 0
    empty = sensor.coverage_map(recent(3), recent(1))
    assert [b.status for b in empty.buckets] == ["gap", "gap"]
    with pytest.raises(ValueError, match="is not before --end"):
        sensor.coverage_map(recent(1), recent(3))
    with pytest.raises(ValueError, match="--by 'week' is not one of hour, day, month"):
        sensor.coverage_map(by="week")
    with sensor.iceberg.transaction() as tx:
        tx.set_properties({EXPECTED_INTERVAL: "P1M"})
    with pytest.raises(ValueError, match="must be a fixed duration"):
        sensor.refresh().coverage_map(recent(3), recent(1))


def test_a_range_inside_a_bucket_counts_the_whole_bucket(lake, scene):
    whole = {b.label: b.rows for b in scene["table"].coverage_map(recent(20), recent(18)).buckets}
    # the first day's file ends at 23:00, before the range starts at 23:30: the map still counts whole days
    cut = {b.label: b.rows for b in scene["table"].coverage_map(f"{recent(20)}T23:30:00Z", f"{recent(19)}T00:00:00.5Z").buckets}
    assert cut == whole == {recent(20): PER_DAY, recent(19): PER_DAY}


def test_a_canary_awaiting_approval_is_backfilling_until_it_publishes(lake, sensor, readings):
    sensor.append(readings(recent(9), days=1, devices=2))
    job = sensor.backfill(source=readings(recent(8), days=3, devices=2), canary=recent(7)).wait()
    assert job.record().phase == "awaiting-approval"
    cmap = sensor.coverage_map(recent(9), recent(5))
    assert [(b.status, b.backfill_jobs) for b in cmap.buckets] == [("has_data", [])] + [("backfilling", [job.id])] * 3
    assert sensor.coverage().num_rows == 0  # nothing published: no signal yet
    job.approve(wait=True)
    signal = {r["partition"]: (r["status"], r["last_writer"], r["rows"]) for r in sensor.coverage().to_pylist()}
    assert signal == {recent(d): ("has_data", job.id, 48) for d in (8, 7, 6)}  # no cadence: no count to compare
