"""Servers and checks shared by the source tests: a real influxd on loopback ports, the CLI, main's state."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import timelake

TIMELAKE = str(Path(sys.executable).parent / "timelake")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Influx:
    """A running influxd: its HTTP endpoint, and writes/queries as a client would send them."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def query(self, q: str) -> bytes:
        data = urllib.parse.urlencode({"q": q}).encode()
        with urllib.request.urlopen(f"{self.endpoint}/query", data=data, timeout=30) as response:
            return response.read()

    def write(self, db: str, lines: str, precision: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/write?db={db}&precision={precision}", data=lines.encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Influx]:
    """influxd 1.x with every file in a temp folder and both listeners on free loopback ports."""
    binary = shutil.which("influxd")
    assert binary, "influxd is missing: `make install` installs the influxdb package"
    root = tmp_path_factory.mktemp("influxd")
    http, rpc = free_port(), free_port()
    config = root / "influxdb.conf"
    config.write_text(f"""
reporting-disabled = true
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{root}/meta"
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{http}"
  log-enabled = false
[monitor]
  store-enabled = false
""")
    log = (root / "influxd.log").open("w")
    process = subprocess.Popen([binary, "-config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{http}"
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/ping", timeout=1).close()
            break
        except OSError:
            if time.time() > deadline or process.poll() is not None:
                process.kill()
                raise AssertionError(f"influxd did not start: {(root / 'influxd.log').read_text()[-2000:]}") from None
            time.sleep(0.1)
    try:
        yield Influx(endpoint)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def cli(*args: str, warehouse: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "TIMELAKE_WAREHOUSE": str(warehouse), **(env or {})}
    return subprocess.run([TIMELAKE, *args], capture_output=True, text=True, env=environ, cwd=cwd, timeout=120)


def assert_nothing_staged(lake: timelake.Lake, table: str, main_snapshot: int | None) -> None:
    """After a failed job: main is where it was, and no backfill branch or lease is left."""
    iceberg = lake.table(table).iceberg
    current = iceberg.current_snapshot()
    assert (current.snapshot_id if current else None) == main_snapshot
    assert [ref for ref in iceberg.metadata.refs if ref != "main"] == []
    assert lake.leases(table) == []


def error_line(result: subprocess.CompletedProcess) -> str:
    """The CLI's failure: exit 1 and exactly one `error:` line (the job line before it is progress)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    return errors[0]


def job_error(lake: timelake.Lake, **spec: object) -> str:
    """The error a job fails with, run in this process (the CLI prints the same text as its one line)."""
    from timelake.spec import JobSpec

    with pytest.raises(Exception) as failure:  # noqa: PT011 (each source has its own error types; the text is checked)
        lake.submit(JobSpec.model_validate(spec), wait=True).wait()
    message = str(failure.value)
    assert "\n" not in message, message
    return message
