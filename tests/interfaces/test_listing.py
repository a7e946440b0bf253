"""Listings a script reads and a person reads: plain columns when piped, a table on a terminal, and
never a cut job id either way."""

from __future__ import annotations

import json
import os
import pty
import subprocess

import pyarrow.parquet as pq

from tests.conftest import TIMELAKE, cli, recent


def _jobs(warehouse, readings, tmp_path) -> list[dict]:
    source = tmp_path / "export.parquet"
    pq.write_table(readings(recent(5), days=1, devices=2), source)
    cli("table", "create", "iot.sensor", "--schema", "ts timestamptz, device_id string, value double", "--series",
        "device_id", warehouse=warehouse)
    cli("backfill", "iot.sensor", "--from", str(source), "--dry-run", warehouse=warehouse)
    cli("backfill", "iot.sensor", "--from", str(source), warehouse=warehouse)
    return json.loads(cli("backfill", "list", "iot.sensor", "--dry-runs", "--json", warehouse=warehouse).stdout)


def test_listings_are_plain_columns_when_piped_and_a_table_on_a_narrow_terminal_never_cutting_ids(
        warehouse, readings, tmp_path):
    jobs = _jobs(warehouse, readings, tmp_path)
    listed = cli("backfill", "list", "iot.sensor", "--dry-runs", warehouse=warehouse).stdout.splitlines()
    assert listed[0].split("\t") == ["job", "table", "mode", "phase", "started", "ended", "units", "read", "written"]
    rows = [line.split("\t") for line in listed[1:]]
    assert [r[0] for r in rows] == [j["job_id"] for j in jobs] and all(r[4] and r[5] for r in rows)
    assert [r[7:] for r in rows] == [["48", "—"], ["48", "48"]]  # a dry run writes nothing
    jobs_only = cli("backfill", "list", "iot.sensor", warehouse=warehouse).stdout.splitlines()
    assert [line.split("\t")[0] for line in jobs_only[1:]] == [jobs[1]["job_id"]]
    history = cli("backfill", "history", "iot.sensor", warehouse=warehouse).stdout.splitlines()
    assert history[1].split("\t")[1] == jobs[1]["job_id"]
    main, child = pty.openpty()
    env = {**os.environ, "TIMELAKE_WAREHOUSE": str(warehouse), "COLUMNS": "50", "TERM": "xterm"}
    subprocess.run([TIMELAKE, "backfill", "list", "iot.sensor", "--dry-runs"], stdin=child, stdout=child, stderr=child, env=env,
                   timeout=120, check=True)
    os.close(child)
    screen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    text = screen.decode(errors="replace")
    assert "\t" not in text and all(j["job_id"] in text for j in jobs), text
