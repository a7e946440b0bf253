"""PostgreSQL / TimescaleDB as a source, against a real server started by the tests (tests/sources/conftest.py).

References are computed by DuckDB from the rows read back from the server; what the backfill asked
of the server is checked on the statements the server logged.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from datetime import datetime, timedelta
from itertools import pairwise

import duckdb
import pyarrow as pa
import pytest

from tests.aws_fixtures import aws, moto_server  # noqa: F401
from tests.conftest import SCHEMA, cli, make_readings, reference_merge, sort_rows
from tests.runner.scenario import run_cli
from tests.sources.conftest import READER_PASSWORD, PgServer, year_start
from timelake.model.timeutil import iso, to_micros

PIECE = re.compile(r"""SELECT \* FROM \((.+)\) AS src WHERE "ts" >= '([^']+)'::timestamptz AND "ts" < '([^']+)'::timestamptz$""")


def _rows(postgres: PgServer, where: str = "true") -> pa.Table:
    return postgres.sql(f"SELECT ts, device_id, value FROM readings WHERE {where}").cast(SCHEMA)


def _window(days_from: int, days_to: int) -> tuple[str, str]:
    start = year_start()
    return iso(to_micros(start + timedelta(days=days_from))), iso(to_micros(start + timedelta(days=days_to)))


def _piece_reads(postgres: PgServer, since: int) -> list[tuple[int, int, object]]:
    """(lo, hi, statement) of each range query logged since ``since``, bounds in UTC microseconds."""
    return [(_us(m[2]), _us(m[3]), s) for s in postgres.statements(since) if (m := PIECE.match(s.sql))]


def _us(text: str) -> int:
    return to_micros(datetime.fromisoformat(text.replace("Z", "+00:00")))


def _count(rows: pa.Table, lo: int, hi: int) -> int:
    """Rows in [lo, hi) (UTC microseconds), counted by DuckDB."""
    con = duckdb.connect()
    con.register("source", rows)
    return con.execute("SELECT count(*) FROM source WHERE epoch_us(ts) >= ? AND epoch_us(ts) < ?", [lo, hi]).fetchone()[0]


def _untouched(lake, snapshot_id) -> None:
    table = lake.catalog.load_table("iot.sensor")
    assert (table.current_snapshot().snapshot_id if table.current_snapshot() else None) == snapshot_id
    assert [r for r in table.metadata.refs if r != "main"] == []


@pytest.fixture
def existing(sensor):
    """Rows on main: three days inside the source's range with other values, and one before it."""
    start = year_start()
    rows = pa.concat_tables([make_readings(start + timedelta(days=90), days=3, devices=3, seed=1),
                             make_readings(start - timedelta(days=5), days=1, devices=2, seed=3)])
    sensor.append(rows)
    return rows


@pytest.mark.parametrize("mode", ["merge", "replace", "append"])
def test_each_mode_equals_the_duckdb_reference(postgres, readings_table, sensor, existing, mode):
    """Days 80..140 of the year: across the 30-day gap and over the existing rows; only that range is read."""
    start, end = _window(80, 140)
    mark = postgres.log_mark()
    job = sensor.backfill(source=postgres.uri(table=readings_table), mode=mode, start=start, end=end).wait()
    logged = postgres.statements(mark)
    source = _rows(postgres, f"ts >= '{start}' AND ts < '{end}'")
    con = duckdb.connect()
    con.register("existing", existing)
    con.register("source", source)
    if mode == "merge":
        expected = reference_merge(existing, source)
    elif mode == "replace":
        expected = con.sql(f"""SELECT * FROM existing WHERE NOT (ts >= '{start}'::TIMESTAMPTZ AND ts < '{end}'::TIMESTAMPTZ)
                               UNION ALL SELECT * FROM source""").to_arrow_table()
    else:
        expected = con.sql("SELECT * FROM existing UNION ALL SELECT * FROM source").to_arrow_table()
    by_value = [("device_id", "ascending"), ("ts", "ascending"), ("value", "ascending")]  # append keeps both rows of a key
    assert sort_rows(sensor.to_arrow()).sort_by(by_value).equals(sort_rows(expected).sort_by(by_value))
    report = job.report()
    assert report["phase"] == "published" and report["rows_in_source"] == source.num_rows
    reads = _piece_reads(postgres, mark)
    assert reads and min(r[0] for r in reads) >= _us(start) and max(r[1] for r in reads) <= _us(end)
    unbounded = [s.sql for s in logged if "readings" in s.sql and "AS src WHERE" not in s.sql
                 and not s.sql.endswith("LIMIT 0") and "::regclass" not in s.sql]
    assert unbounded == []  # min/max and the estimate are bounded by the job's range too


def test_each_piece_reads_only_its_range(postgres, readings_table, sensor):
    """The year in pieces of ~20,000 rows: one range query per piece, the ranges tile [min, max],
    each is read once, and nothing reads the table without a range but min/max, the estimate and
    the empty schema probe."""
    mark = postgres.log_mark()
    job = sensor.backfill(source=postgres.uri(table=readings_table, piece_rows="20000"), dry_run=True).wait()
    statements = [s.sql for s in postgres.statements(mark) if "readings" in s.sql]
    reads = _piece_reads(postgres, mark)
    assert len(reads) == len(job.record().state["source_plan"]["edges"]) - 1 >= 8
    bounds = sorted((lo, hi) for lo, hi, _ in reads)
    assert all(a[1] == b[0] for a, b in pairwise(bounds)), bounds
    lo, hi = postgres.sql("SELECT min(ts) AS lo, max(ts) AS hi FROM readings").to_pylist()[0].values()
    assert (bounds[0][0], bounds[-1][1]) == (to_micros(lo), to_micros(hi) + 1)
    others = [s for s in statements if not PIECE.match(s)]
    assert all(re.search(r"min\(\"ts\"\)|^EXPLAIN|LIMIT 0$|::regclass::oid", s) for s in others), others
    assert job.report()["rows_in_source"] == _count(_rows(postgres), bounds[0][0], bounds[-1][1])


@pytest.mark.parametrize("piece_rows, days_a_piece", [("2000", 4), ("400", 1), ("100000", 24)])
def test_pieces_are_cut_on_day_edges_and_each_day_is_written_by_its_scan_task(postgres, readings_table, sensor, lake,
                                                                              piece_rows, days_a_piece):
    """A day holds 480 rows. Pieces are whole days: as many as fit the piece size (at least one), so no
    day straddles two pieces and each day is written by the scan task that read it, with no spill and
    no write step. The table is what the rows are, each piece's range is read once, and days of the
    gap (no rows) write nothing."""
    start, end = _window(90, 114)  # 10 days of rows, the 30-day gap, nothing after it in range
    mark = postgres.log_mark()
    job = sensor.backfill(source=postgres.uri(table=readings_table, piece_rows=piece_rows), start=start, end=end).wait()
    record = job.record()
    edges = record.state["source_plan"]["edges"]
    day = 86_400_000_000
    assert all(edge % day == 0 for edge in edges[1:-1]) and edges[0] == _us(start)
    widths = {b - a for a, b in pairwise(edges[1:-1])}  # days a piece come from the planner's row estimate,
    assert len(widths) <= 1 and all(abs(w // day - days_a_piece) <= 1 for w in widths), widths  # which moves with ANALYZE
    reads = sorted((lo, hi) for lo, hi, _ in _piece_reads(postgres, mark))
    assert reads == list(pairwise(edges))
    units = lake.runtime.store.units(job.id)
    assert record.state["units_total"] == 10 == len([u for u in units if u.info.get("direct")])
    assert all(u.result["spill_bytes_read"] == 0 for u in units)
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(_rows(postgres, f"ts >= '{start}' AND ts < '{end}'")))
    assert all(c["passed"] for c in job.report()["checks"])


def test_days_the_scan_wrote_survive_a_crash_and_publish_once(postgres, readings_table, sensor, lake, warehouse):
    """The `timelake` process dies after the scan wrote its third day, with pieces still to read; resume
    reads the source again from the plan it pinned and publishes each day's file once."""
    start, end = _window(40, 48)
    uri = postgres.uri(table=readings_table, piece_rows="1000")
    crashed = run_cli(warehouse, "backfill", "iot.sensor", "--from", uri, "--start", start, "--end", end,
                      "--max-concurrency", "1", "--json", crash_at="scan.direct:3")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    [job_id] = [job.id for job in lake.jobs()]
    record = lake.job(job_id).record()
    assert record.phase == "scanning" and record.state["direct_partitions"] == 8
    assert sensor.refresh().to_arrow().num_rows == 0
    resumed = run_cli(warehouse, "backfill", "resume", job_id, "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["phase"] == "published"
    units = lake.runtime.store.units(job_id)
    assert len(units) == 8 and all(u.info.get("direct") for u in units)
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(_rows(postgres, f"ts >= '{start}' AND ts < '{end}'")))
    publishes = [s for s in sensor.iceberg.snapshots() if (s.summary or {}).get("timelake.step") == "publish"]
    assert len(publishes) == 1


def test_a_local_time_column_keeps_even_pieces_and_the_spill(postgres, readings_table, sensor, lake):
    """Wall-clock times cannot tell which UTC day a piece holds exactly (a DST fold), so the pieces stay
    even spans of the range and every day goes through the spill."""
    start, end = _window(10, 14)
    job = sensor.backfill(source=postgres.uri(piece_rows="400"), tz="Europe/Berlin", start=start, end=end,
                          query="SELECT ts AT TIME ZONE 'Europe/Berlin' AS ts, device_id, value FROM readings").wait()
    edges = job.record().state["source_plan"]["edges"]
    assert len(edges) > 3 and any(edge % 86_400_000_000 for edge in edges[1:-1])
    assert not any(u.info.get("direct") for u in lake.runtime.store.units(job.id))
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(_rows(postgres, f"ts >= '{start}' AND ts < '{end}'")))


def test_pieces_follow_timescaledb_chunks_when_the_catalog_is_there(postgres, readings_table, sensor):
    """A stand-in for TimescaleDB's ``timescaledb_information.chunks`` (same columns) over monthly
    chunk tables: pieces are the chunks, sized by each chunk's statistics (the gap month is small)."""
    start = year_start()
    months = [start + timedelta(days=30 * i) for i in range(14)]
    chunk_rows = []
    postgres.sql("CREATE SCHEMA _timescaledb_internal")
    try:
        for i, (a, b) in enumerate(pairwise(months)):
            postgres.sql(f"CREATE TABLE _timescaledb_internal._hyper_1_{i}_chunk AS SELECT * FROM readings "
                         f"WHERE ts >= '{a.isoformat()}' AND ts < '{b.isoformat()}'")
            postgres.sql(f"ANALYZE _timescaledb_internal._hyper_1_{i}_chunk")
            chunk_rows.append(f"('public', 'readings', '_timescaledb_internal', '_hyper_1_{i}_chunk', "
                              f"'{a.isoformat()}'::timestamptz, '{b.isoformat()}'::timestamptz)")
        postgres.sql("CREATE SCHEMA timescaledb_information")
        postgres.sql("CREATE VIEW timescaledb_information.chunks (hypertable_schema, hypertable_name, chunk_schema, "
                     f"chunk_name, range_start, range_end) AS VALUES {', '.join(chunk_rows)}")
        job = sensor.backfill(source=postgres.uri(table=readings_table), dry_run=True).wait()
    finally:
        postgres.sql("DROP SCHEMA IF EXISTS timescaledb_information CASCADE")
        postgres.sql("DROP SCHEMA _timescaledb_internal CASCADE")
    plan = job.record().state["source_plan"]
    source = _rows(postgres)
    first, last = (to_micros(t.as_py()) for t in (source.column("ts")[0], source.column("ts")[-1]))
    assert plan["edges"] == [first, *[to_micros(m) for m in months[1:] if first < to_micros(m) <= last], last + 1]
    per_chunk = [_count(source, a, b) for a, b in pairwise(plan["edges"])]
    assert [round(n) for n in plan["piece_rows"]] == per_chunk and min(per_chunk) < max(per_chunk) / 2
    assert job.report()["rows_in_source"] == sum(per_chunk)


def test_a_dropped_connection_rereads_the_piece_and_duplicates_nothing(postgres, readings_table, sensor):
    """The server stalls once in the middle of one piece (a function in the query); another
    connection terminates that backend, the piece is read again, the table is exact."""
    stall_at = iso(to_micros(year_start() + timedelta(days=20, hours=5)))
    postgres.sql("CREATE SEQUENCE IF NOT EXISTS stall_seq")
    postgres.sql(f"""CREATE OR REPLACE FUNCTION stall_once(t timestamptz) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            IF t = '{stall_at}'::timestamptz AND current_query() LIKE '%AS src WHERE%' AND nextval('stall_seq') = 1 THEN
                PERFORM pg_sleep(60);
            END IF;
            RETURN true;
        END $$""")
    end = iso(to_micros(year_start() + timedelta(days=40)))
    query = f"SELECT ts, device_id, value FROM readings WHERE ts < '{end}' AND stall_once(ts)"
    killed: list[int] = []

    def kill_the_stalled_reader() -> None:
        deadline = time.time() + 60
        while not killed and time.time() < deadline:
            found = postgres.sql("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%stall_once%'")
            for pid in found.column("pid").to_pylist():
                postgres.sql(f"SELECT pg_terminate_backend({pid})")
                killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_stalled_reader)
    killer.start()
    mark = postgres.log_mark()
    try:
        job = sensor.backfill(source=postgres.uri(piece_rows="4000"), query=query).wait()
    finally:
        killed.append(0)
        killer.join()
    expected = _rows(postgres, f"ts < '{end}'")
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(expected))
    assert job.report()["rows_in_source"] == expected.num_rows and job.report()["rows_duplicate_in_source"] == 0
    reads = [(lo, hi) for lo, hi, _ in _piece_reads(postgres, mark)]
    twice = [r for r in set(reads) if reads.count(r) == 2]
    assert len(killed) == 2 and len(twice) == 1 and len(reads) == len(set(reads)) + 1
    assert twice[0][0] <= _us(stall_at) < twice[0][1]


def test_source_rows_per_second_holds_the_read_rate(postgres, readings_table, sensor, warehouse):
    """Measured on the server, by when each range query started: a piece's query starts once the
    previous piece was read to its end, so (rows of all pieces but the last) / (first start .. last
    start) is the rate at which rows left the server (its end times would not be: the server
    finishes a COPY as soon as the socket buffers take the rest)."""
    rate = 20_000
    start, end = _window(0, 70)  # 70 days x 24 h x 20 devices: 33,600 rows, ~1.7 s at this rate
    mark = postgres.log_mark()
    run = cli("backfill", "iot.sensor", "--from", postgres.uri(table=readings_table, piece_rows="3000"),
              "--start", start, "--end", end, "--source-rows-per-second", str(rate), "--dry-run", "--json",
              warehouse=warehouse)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    reads = sorted(_piece_reads(postgres, mark), key=lambda r: r[2].start)
    source = _rows(postgres)
    rows = sum(_count(source, lo, hi) for lo, hi, _ in reads[:-1])
    seconds = (reads[-1][2].start - reads[0][2].start).total_seconds()
    assert len(reads) >= 10 and rows > 25_000
    assert abs(rows / seconds - rate) <= 0.1 * rate, f"{rows} rows in {seconds:.2f} s: {rows / seconds:,.0f} rows/s"
    assert report["source_limits"] == {"max_connections": 2, "rows_per_second": rate,
                                       "read_eta_seconds": round(report["rows_in_source"] / rate, 1)}


def test_the_dry_run_shows_the_source_limits_and_their_eta(postgres, readings_table, sensor, warehouse):
    run = cli("backfill", "iot.sensor", "--from", postgres.uri(table=readings_table), "--dry-run",
              "--source-max-connections", "3", warehouse=warehouse, check=False, env={"COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    line = next(text for text in run.stdout.splitlines() if "source limits" in text)
    rows = _rows(postgres).num_rows
    assert "3 connection(s), 250,000 rows/s" in line and f"~{round(rows / 250_000, 1)} s" in line, line


def test_password_from_the_environment_never_lands_in_the_job(postgres, readings_table, sensor):
    os.environ["TEST_READER_PW"] = READER_PASSWORD
    try:
        start, end = _window(0, 2)
        job = sensor.backfill(source=postgres.uri(user="reader", table=readings_table, password_env="TEST_READER_PW"),
                              start=start, end=end).wait()
    finally:
        del os.environ["TEST_READER_PW"]
    record = job.record()
    assert job.report()["rows_written"] == _rows(postgres, f"ts >= '{start}' AND ts < '{end}'").num_rows > 0
    stored = json.dumps([record.spec, record.state, job.report()], default=str)
    assert READER_PASSWORD not in stored


def test_password_from_a_secrets_manager_secret(postgres, readings_table, sensor, aws):
    import boto3

    secret = boto3.client("secretsmanager").create_secret(
        Name="timelake/reader", SecretString=json.dumps({"username": "reader", "password": READER_PASSWORD}))["ARN"]
    start, end = _window(0, 2)
    job = sensor.backfill(source=postgres.uri(user="reader", table=readings_table, secret=secret), start=start, end=end).wait()
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(_rows(postgres, f"ts >= '{start}' AND ts < '{end}'")))
    assert READER_PASSWORD not in json.dumps([job.record().spec, job.record().state, job.report()], default=str)


def test_a_password_in_the_uri_is_refused_before_the_job_is_stored(postgres, lake, sensor):
    from timelake.model.spec import JobSpec

    with pytest.raises(ValueError, match="holds a password; pass it through PGPASSWORD"):
        JobSpec(table="iot.sensor", source=f"postgresql://reader:{READER_PASSWORD}@127.0.0.1:{postgres.port}/timelake?table=readings")
    with pytest.raises(ValueError, match="holds a password"):
        sensor.backfill(source=f"postgresql://reader:{READER_PASSWORD}@127.0.0.1:{postgres.port}/timelake?table=readings")
    assert lake.runtime.store.list_jobs() == []


@pytest.mark.parametrize("case", ["unreachable", "wrong password", "missing table", "query without the time column"])
def test_bad_input_fails_in_one_line_and_stages_nothing(postgres, readings_table, lake, sensor, existing, warehouse, case):
    wrong = "not-the-Password-42"
    args = {
        "unreachable": ["--from", f"postgresql://postgres@127.0.0.1:{_closed_port()}/timelake?table=readings"],
        "wrong password": ["--from", postgres.uri(user="reader", table=readings_table, password_env="PW")],
        "missing table": ["--from", postgres.uri(table="public.nope")],
        "query without the time column": ["--from", postgres.uri(), "--query", "SELECT device_id, value FROM readings"],
    }[case]
    expected = {
        "unreachable": r"cannot connect to PostgreSQL source .*Connection refused",
        "wrong password": r"cannot connect to PostgreSQL source .*password authentication failed for user \"reader\"",
        "missing table": r"cannot read PostgreSQL source .*relation \"public.nope\" does not exist",
        "query without the time column": r"has no column 'ts' \(the time column\); it has device_id, value",
    }[case]
    before = sensor.iceberg.current_snapshot().snapshot_id
    run = cli("backfill", "iot.sensor", *args, warehouse=warehouse, check=False, env={"PW": wrong})
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.returncode == 1 and len(errors) == 1 and run.stderr.strip().endswith(errors[0]), run.stderr
    assert re.search(expected, errors[0]), errors[0]
    assert wrong not in run.stderr + run.stdout
    _untouched(lake, before)
    [job] = lake.runtime.store.list_jobs()
    assert job.phase == "failed" and wrong not in json.dumps([job.spec, job.state])


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("column, options", [
    ("ts AT TIME ZONE 'Europe/Berlin'", {"tz": "Europe/Berlin"}),  # timestamp without time zone, local wall clock
    ("extract(epoch from ts)::int8", {"time_unit": "s"}),  # integer epoch seconds
])
def test_naive_and_epoch_time_columns_push_the_range_down_in_their_own_terms(postgres, readings_table, sensor, column, options):
    start, end = _window(10, 13)
    mark = postgres.log_mark()
    job = sensor.backfill(source=postgres.uri(), query=f"SELECT {column} AS ts, device_id, value FROM readings",
                          start=start, end=end, **options).wait()
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(_rows(postgres, f"ts >= '{start}' AND ts < '{end}'")))
    [read] = [s.sql for s in postgres.statements(mark) if s.sql.startswith("SELECT * FROM (") and "AS src WHERE" in s.sql]
    typed = r"'[^']+'::timestamp" if "tz" in options else r"\d+"  # the column's own type, so its index applies
    assert re.search(rf'"ts" >= {typed} AND "ts" < {typed}$', read), read
    report = job.report()
    assert report["rows_in_source"] - report["rows_outside_range"] == 3 * 24 * 20


def test_reads_never_start_parallel_workers_on_the_source(postgres, sensor):
    """One connection is one backend on the server. In a database whose settings make the planner
    start parallel workers for any query, a plain read of a piece's range plans a Gather (the
    positive control), and none of the backfill's reads does (auto_explain logs every plan)."""
    db = "parallel_probe"
    postgres.sql(f"CREATE DATABASE {db}", db="postgres")
    try:
        for setting in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0", "min_parallel_table_scan_size = 0",
                        "min_parallel_index_scan_size = 0", "session_preload_libraries = 'auto_explain'",
                        "auto_explain.log_min_duration = 0"):
            postgres.sql(f"ALTER DATABASE {db} SET {setting}", db="postgres")
        start = year_start()
        postgres.sql(f"""CREATE TABLE readings AS
            SELECT '{start.isoformat()}'::timestamptz + m * interval '1 minute' AS ts, 'd' || (m % 7) AS device_id,
                   (m % 1000)::float8 AS value FROM generate_series(0, 20 * 1440 - 1) AS m""", db=db)
        postgres.sql("CREATE INDEX ON readings (ts)", db=db)
        postgres.sql("ANALYZE readings", db=db)
        piece = f"""SELECT * FROM (SELECT * FROM public.readings) AS src WHERE "ts" >= '{start.isoformat()}'::timestamptz"""
        mark = postgres.log_mark()
        postgres.sql(piece, db=db)
        assert "Workers Planned" in _log_since(postgres, mark)
        mark = postgres.log_mark()
        job = sensor.backfill(source=postgres.uri(db=db, table="public.readings", piece_rows="4000")).wait()
        plans = [p for p in _log_since(postgres, mark).split(" plan:") if "AS src WHERE" in p.split("\n", 2)[1]]
        assert len(plans) == len(job.record().state["source_plan"]["edges"]) - 1 >= 7
        assert not [p for p in plans if "Workers Planned" in p or "Gather" in p]
        assert sensor.to_arrow().num_rows == job.report()["rows_written"] == 20 * 1440
    finally:
        postgres.sql(f"DROP DATABASE {db} WITH (FORCE)", db="postgres")


def _most_at_once(statements: list) -> int:
    """The most statements that were running at the same moment."""
    edges = sorted([(s.start, 1) for s in statements] + [(s.end, -1) for s in statements], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def _log_since(postgres: PgServer, mark: int) -> str:
    with postgres.log.open("rb") as handle:
        handle.seek(mark)
        return handle.read().decode(errors="replace")


@pytest.mark.parametrize("connections", [1, 2])
def test_scan_tasks_read_each_piece_once_whether_one_reader_reads_ahead_or_several_share_the_source(
    postgres, readings_table, sensor, monkeypatch, connections,
):
    """Many scan tasks over 60 days: one connection reads task after task, fetching the next task's
    first piece while this task's last one is mapped; two connections read tasks side by side. Either
    way every piece is read exactly once, one connection serves a reader, and the table is exact."""
    import timelake.steps.plan

    monkeypatch.setattr(timelake.steps.plan, "MIN_TASK_BYTES", 1)
    start, end = _window(0, 60)
    mark = postgres.log_mark()
    job = sensor.backfill(source=postgres.uri(table=readings_table, piece_rows="2000"), start=start, end=end,
                          source_max_connections=connections, max_concurrency=2).wait()
    reads = _piece_reads(postgres, mark)
    edges = job.record().state["source_plan"]["edges"]
    assert sorted((lo, hi) for lo, hi, _ in reads) == list(pairwise(edges))
    assert len(job.record().state["scan_tasks"]) >= 4
    if connections == 1:
        assert len({s.pid for _, _, s in reads}) == 1  # one connection, kept from task to task
    assert _most_at_once([s for _, _, s in reads]) <= connections
    expected = _rows(postgres, f"ts >= '{start}' AND ts < '{end}'")
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(expected))


def test_a_piece_read_ahead_that_the_next_read_does_not_want_is_dropped(postgres, readings_table):
    """The hint names piece 5, the next read asks for piece 3: it gets piece 3's rows and only those."""
    from timelake.sources.postgres import PostgresSource

    src = PostgresSource(postgres.uri(table=readings_table, piece_rows="20000"), time_column="ts")
    names, edges = src.pieces(), src.plan_state()["edges"]
    src.read_next([names[5]])
    first = [b for b in src.read(names[:2])]
    second = [b for b in src.read([names[3]])]
    source = _rows(postgres)
    assert sum(b.data.num_rows for b in first) == _count(source, edges[0], edges[2])
    assert {b.origin for b in second} == {names[3]}
    assert sum(b.data.num_rows for b in second) == _count(source, edges[3], edges[4]) > 0
