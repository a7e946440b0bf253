"""Every bad input the review found exits 1 with one ``error:`` line: no traceback, no hang, main
untouched; no secret is stored; the warehouse is its owner's only."""

from __future__ import annotations

import json
import stat

import pytest

from tests.conftest import cli_in_process, recent


@pytest.fixture
def seeded(sensor, readings, tmp_path, monkeypatch):
    sensor.append(readings(recent(10), days=1, devices=2))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.csv").write_text(f"ts,device_id,value\n{recent(5)}T00:00:00Z,a,1\n")
    return sensor


def _one_error(warehouse, *args: str) -> str:
    code, err = cli_in_process(*args, "--warehouse", str(warehouse))
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


@pytest.mark.parametrize("args, match", [
    (["--from", "ok.csv", "--tz", "Mars/Olympus", "--start", "2024-01-01"], "unknown time zone 'Mars/Olympus'"),
    (["--from", "ok.csv", "--tz", "Europe/Berlin", "--end", "9999-12-31T23:00"], "years 1-9998"),
    (["--from", "ok.csv", "--assert", ""], "assertion 0 is empty"),
    (["--from", "ok.csv", "--max-concurrency", "0"], "max_concurrency"),
    (["--from", "postgresql://u:p/w@db/x?table=t"], "PGPASSWORD, password_env=VAR or secret=ARN"),
    (["--from", "postgresql://u:p#w@db/x?table=t"], "PGPASSWORD, password_env=VAR or secret=ARN"),
    (["--from", "postgresql://db/x?table=t&password=hunter2"], "PGPASSWORD, password_env=VAR or secret=ARN"),
    (["--from", "<memory>"], "in-process data"),
])
def test_bad_flags_are_one_line(seeded, warehouse, args, match):
    before = seeded.refresh().iceberg.metadata.refs["main"]
    assert match in _one_error(warehouse, "backfill", "iot.sensor", *args)
    assert seeded.refresh().iceberg.metadata.refs["main"] == before


@pytest.mark.parametrize("content, match", [
    ("[]", "a job is a JSON object, not list"),
    ("[" * 5000 + "]" * 5000, "nested more than 32 deep"),
    (None, "Is a directory"),
    ('{"table": "iot.other", "source": "ok.csv"}', "is for table 'iot.other' but the command names 'iot.sensor'"),
    ('{"source": "ok.csv", "max_concurrency": true}', "max_concurrency"),
    ('{"source": "ok.csv", "assertions": ' + json.dumps(["SELECT 1"] * 101) + "}", "at most 100"),
])
def test_bad_job_files_are_one_line(seeded, warehouse, tmp_path, content, match):
    path = tmp_path / "job.json"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    assert match in _one_error(warehouse, "backfill", "iot.sensor", "--job", str(path))


def test_year_9999_in_a_csv_is_one_line_before_any_lease(seeded, warehouse, tmp_path):
    (tmp_path / "far.csv").write_text("ts,device_id,value\n9999-12-31T12:00:00Z,a,1\n")
    assert "year 9999" in _one_error(warehouse, "backfill", "iot.sensor", "--from", "far.csv")
    assert seeded.lake.leases("iot.sensor") == []


def test_escape_bytes_from_a_cell_are_not_echoed(seeded, warehouse, tmp_path):
    (tmp_path / "esc.csv").write_text(f"ts,device_id,value\n{recent(5)}T00:00:00Z,a,\x1b[2J\x1b]0;pwned\x07\n")
    code, err = cli_in_process("backfill", "iot.sensor", "--from", "esc.csv", "--warehouse", str(warehouse))
    assert code == 1 and "\x1b" not in err and "\x07" not in err


def test_missing_tables_and_aborted_jobs_exit_1(seeded, warehouse):
    assert "iot.nope" in _one_error(warehouse, "backfill", "leases", "iot.nope")
    assert "iot.nope" in _one_error(warehouse, "backfill", "history", "iot.nope")
    job = seeded.lake.create_job(__import__("timelake").JobSpec(table="iot.sensor", source="ok.csv"))
    job.abort()
    assert "was aborted" in _one_error(warehouse, "backfill", "resume", job.id)


def test_coverage_refuses_a_million_buckets(seeded, warehouse):
    line = _one_error(warehouse, "coverage", "iot.sensor", "--by", "hour", "--start", "1900-01-01", "--end", "2100-01-01")
    assert "1,753,176 buckets, at most 100,000" in line and "--by" in line


def test_a_refused_password_is_stored_nowhere(seeded, warehouse):
    secret = "s3cr3t-planted-7f1c"
    for source in (f"postgresql://db/x?table=t&password={secret}", f"postgresql://u:{secret}/x@db/x?table=t"):
        assert secret not in _one_error(warehouse, "backfill", "iot.sensor", "--from", source)
    for path in warehouse.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_the_warehouse_is_its_owners_only(seeded, warehouse):
    assert stat.S_IMODE(warehouse.stat().st_mode) == 0o700
    for name in ("jobs.db", "catalog.db"):
        assert stat.S_IMODE((warehouse / name).stat().st_mode) == 0o600


def test_a_runaway_assertion_times_out_and_releases_the_lease(seeded, readings):
    import timelake

    endless = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT * FROM r WHERE n < 0"
    before = seeded.refresh().iceberg.metadata.refs["main"]
    job = seeded.backfill(source=readings(recent(4)), assertions=[endless], assertion_timeout=1)
    with pytest.raises(timelake.ValidationFailed, match="assertion timeout of 1 s"):
        job.wait()
    assert job.record().phase == "failed_validation" and seeded.lake.leases("iot.sensor") == []
    assert seeded.refresh().iceberg.metadata.refs["main"] == before
