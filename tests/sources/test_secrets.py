"""A source password given the supported ways (PGPASSWORD, password_env=VAR) is stored nowhere: not
in the job store, any warehouse file, the report, `list`/`status`/`history --json`, the rows of
``timelake.backfills``, the snapshot summaries, nor a failed job's error line."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

import timelake
from tests.conftest import cli
from tests.sources.conftest import READER_PASSWORD
from tests.sources.test_postgres import _window

TABLE = "iot.sensor"


def _cli(warehouse: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The command with only ``env``'s password set (the one planted, or none)."""
    return cli(*args, warehouse=warehouse, check=False, env={"PGPASSWORD": None, "SECRET_PW": None, **env})


def _file_bytes(root: Path) -> list[tuple[Path, bytes]]:
    """Every file under ``root`` as stored, and gzip-compressed ones (metadata) also as their content."""
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found.append((path, data))
            if data[:2] == b"\x1f\x8b":
                found.append((path, gzip.decompress(data)))
    return found


@pytest.mark.parametrize("way", ["PGPASSWORD", "password_env"])
def test_a_planted_password_is_stored_nowhere(postgres, readings_table, sensor, warehouse, way):
    env = {"PGPASSWORD": READER_PASSWORD} if way == "PGPASSWORD" else {"SECRET_PW": READER_PASSWORD}
    params = {} if way == "PGPASSWORD" else {"password_env": "SECRET_PW"}
    start, end = _window(0, 2)
    outputs = []
    ran = _cli(warehouse, "backfill", TABLE, "--from", postgres.uri(user="reader", table=readings_table, **params),
               "--start", start, "--end", end, "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    job_id = json.loads(ran.stdout)["job_id"]
    failed = _cli(warehouse, "backfill", TABLE, "--from", postgres.uri(user="reader", table="public.nope", **params),
                  "--start", start, "--end", end, env=env)
    assert failed.returncode == 1 and "public.nope" in failed.stderr  # a failure that got as far as the server
    outputs += [ran, failed]
    for args in (["backfill", "list", TABLE, "--json"], ["backfill", "history", TABLE, "--json"],
                 ["backfill", "status", job_id, "--json"], ["backfill", "list", TABLE]):
        shown = _cli(warehouse, *args, env={})
        assert shown.returncode == 0, shown.stderr
        outputs.append(shown)
    assert any(job_id in o.stdout for o in outputs[2:])  # the outputs checked do describe the job

    lake = timelake.connect(warehouse=warehouse)
    provenance = lake.table("timelake.backfills").iceberg.scan().to_arrow()
    assert provenance.num_rows == 1
    summaries = [s.summary for t in (TABLE, "timelake.backfills") for s in lake.table(t).iceberg.snapshots()]
    secret = READER_PASSWORD.encode()
    leaks = [str(path) for path, data in _file_bytes(warehouse) if secret in data]
    leaks += [" ".join(o.args) for o in outputs if READER_PASSWORD in o.stdout + o.stderr]
    leaks += ["timelake.backfills"] if READER_PASSWORD in json.dumps(provenance.to_pylist(), default=str) else []
    leaks += ["snapshot summaries"] if READER_PASSWORD in json.dumps([s.model_dump(mode="json") for s in summaries], default=str) else []
    assert leaks == []
    # the search sees what is stored: the source URI, kept in the job store and the provenance row, is found
    uri = f"127.0.0.1:{postgres.port}".encode()
    store = b"".join(path.read_bytes() for path in warehouse.glob("jobs.db*"))  # with its write-ahead log
    assert uri in store and uri.decode() in str(provenance.column("source_uri")[0])
