"""DuckDB SQL as the source: `--from-sql` on the command line and `CALL timelake_backfill(...)` in a session."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

import timelake
from tests.conftest import SCHEMA, make_readings, recent, sort_rows
from tests.sources.conftest import assert_nothing_staged, cli, error_line, job_error
from timelake.interfaces.sql import register
from timelake.model.spec import JobSpec
from timelake.sources.base import SourceError

TABLES = ("iot.from_files", "iot.from_sql", "iot.from_call")


@pytest.fixture
def exports(tmp_path: Path, lake: timelake.Lake, monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    """Two CSV exports in tmp_path/exports (the working directory) and three empty tables to fill."""
    folder = tmp_path / "exports"
    folder.mkdir()
    rows = make_readings(recent(12), days=3, devices=4, step_minutes=20)
    pcsv.write_csv(rows.slice(0, 400), folder / "a.csv")
    pcsv.write_csv(rows.slice(400), folder / "b.csv")
    for name in TABLES:
        lake.create_table(name, schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                          retention="P3Y")
    monkeypatch.chdir(tmp_path)
    return rows


def test_call_and_from_sql_give_the_table_that_from_gives(exports, lake, warehouse, tmp_path):
    assert cli("backfill", "iot.from_files", "--from", "exports/*.csv", warehouse=warehouse, cwd=tmp_path).returncode == 0
    done = cli("backfill", "iot.from_sql", "--from-sql", "SELECT * FROM read_csv('exports/*.csv')", "--json",
               warehouse=warehouse, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["phase"] == "published"

    con = duckdb.connect()
    register(con, lake)
    # The query runs on the caller's connection: a view defined there is visible to it.
    con.execute("CREATE VIEW exported AS SELECT * FROM read_csv('exports/*.csv')")
    rows = con.sql("CALL timelake_backfill('iot.from_call', 'SELECT * FROM exported', mode := 'merge')").fetchall()
    assert [(phase, written) for _, phase, _, written, _ in rows] == [("published", exports.num_rows)]
    assert json.loads(rows[0][4])["rows_in_source"] == exports.num_rows

    expected = sort_rows(exports)
    for name in TABLES:
        assert sort_rows(lake.table(name).to_arrow()).equals(expected), name


def test_bad_queries_are_one_clear_line_and_nothing_is_staged(exports, lake, warehouse, tmp_path):
    table = lake.table("iot.from_sql")
    table.append(exports.slice(0, 10))
    main = table.refresh().iceberg.current_snapshot().snapshot_id
    cases = {
        "SELECT device_id, value FROM read_csv('exports/*.csv')":
            "column 'ts' (source 'ts') is required but missing from the source (source columns: device_id, value)",
        "SELECT * FROM read_csv('missing/*.csv')": "the source query failed: IO Error: No files found",
    }
    no_time, bad = cases
    assert cases[no_time] in error_line(cli("backfill", "iot.from_sql", "--from-sql", no_time, warehouse=warehouse,
                                            cwd=tmp_path))
    assert cases[bad] in job_error(lake, table="iot.from_sql", source="duckdb:", query=bad)
    con = duckdb.connect()
    register(con, lake)
    with pytest.raises(duckdb.Error, match="column 'ts' .source 'ts'. is required but missing"):
        con.execute("CALL timelake_backfill('iot.from_sql', 'SELECT device_id, value FROM read_csv(''exports/*.csv'')')")
    assert_nothing_staged(lake, "iot.from_sql", main)


def test_a_duckdb_database_file_is_opened_read_only_by_every_reader(exports, lake, tmp_path):
    with duckdb.connect(str(tmp_path / "history.db")) as con:
        con.execute("CREATE TABLE readings AS SELECT * FROM read_csv('exports/*.csv')")
    spec = JobSpec(table="iot.from_sql", source=f"duckdb:{tmp_path / 'history.db'}",
                   query="SELECT * FROM readings WHERE device_id <> 'd03'")
    with duckdb.connect(str(tmp_path / "history.db"), read_only=True):  # another reader holds it open meanwhile
        lake.submit(spec, wait=True).wait()
    expected = sort_rows(exports.filter(pa.compute.not_equal(exports["device_id"], "d03")))
    assert sort_rows(lake.table("iot.from_sql").to_arrow()).equals(expected)
    with pytest.raises(SourceError, match="DuckDB database .*nope.db does not exist"):
        lake.submit(spec.model_copy(update={"source": "duckdb:nope.db", "job_id": "bf-nope"}), wait=True).wait()


def test_call_takes_every_job_field_as_a_named_parameter(exports, lake):
    """Naive local times under another column name, a range and a dry run first: tz, map, start, "end"
    (quoted: END is an SQL keyword) and dry_run through the CALL, as through the job JSON."""
    con = duckdb.connect()
    register(con, lake)
    local = ("SELECT strftime(timezone('Europe/Berlin', ts), '%Y-%m-%d %H:%M:%S')::TIMESTAMP AS t, device_id, value "
             "FROM read_csv('exports/*.csv')")
    start, end = recent(11), recent(10)
    call = (f"CALL timelake_backfill('iot.from_call', '{local.replace(chr(39), chr(39) * 2)}', tz := 'Europe/Berlin', "
            f"\"map\" := {{'ts': 't'}}, start := '{start}', \"end\" := '{end}', dry_run := {{dry}})")
    day = duckdb.sql(f"SELECT * FROM exports WHERE ts >= timezone('Europe/Berlin', '{start}'::TIMESTAMP) "  # a naive bound is
                     f"AND ts < timezone('Europe/Berlin', '{end}'::TIMESTAMP)").to_arrow_table().cast(SCHEMA)  # local too
    dry = json.loads(con.sql(call.replace("{dry}", "true")).fetchall()[0][4])
    assert dry["phase"] == "dry_run_complete" and lake.table("iot.from_call").to_arrow().num_rows == 0
    assert dry["rows_outside_range"] == exports.num_rows - day.num_rows > 0
    report = json.loads(con.sql(call.replace("{dry}", "false")).fetchall()[0][4])
    assert report["phase"] == "published" and report["rows_written"] == day.num_rows
    assert sort_rows(lake.table("iot.from_call").to_arrow()).equals(sort_rows(day))
    with pytest.raises(duckdb.Error, match="unknown time zone"):
        con.execute("CALL timelake_backfill('iot.from_call', 'SELECT 1', tz := 'Mars/Olympus')")
