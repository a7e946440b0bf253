"""Real servers for the source tests, each started once per test process on loopback ports: a
PostgreSQL that logs every statement with its start time and duration (so tests check what the
backfill asked of the database, not only what it loaded) and an influxd; plus the CLI and checks of
main's state shared by the source tests.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
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
    from timelake.model.spec import JobSpec

    with pytest.raises(Exception) as failure:  # noqa: PT011 (each source has its own error types; the text is checked)
        lake.submit(JobSpec.model_validate(spec), wait=True).wait()
    message = str(failure.value)
    assert "\n" not in message, message
    return message


PG_BIN = Path("/usr/lib/postgresql/15/bin")
READER_PASSWORD = "s3cr3t-Reader-pw"
# Simple queries log "statement: SQL", the extended protocol (which the driver uses) "execute <name>: SQL";
# both end with a bare "duration: N ms" line (the "duration: N ms  parse ..." lines are other phases).
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC \[(\d+)\] LOG:  "
                   r"(?:(statement|execute [^:]+): (.*)|(duration): [\d.]+ ms)$")
_COPY = re.compile(r"^COPY \((.*)\) TO STDOUT \(FORMAT binary\)$")


@dataclass(frozen=True)
class Statement:
    pid: int
    start: datetime
    end: datetime | None
    sql: str


@dataclass
class PgServer:
    root: Path
    port: int

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def uri(self, user: str = "postgres", db: str = "timelake", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}" + (f"?{query}" if query else "")

    def sql(self, statement: str, db: str = "timelake") -> pa.Table | None:
        from adbc_driver_postgresql import dbapi

        with dbapi.connect(self.uri(db=db), autocommit=True) as con, con.cursor() as cur:
            cur.execute(statement)
            try:
                return cur.fetch_arrow_table()
            except Exception:
                return None

    def log_mark(self) -> int:
        return self.log.stat().st_size

    def statements(self, since: int = 0) -> list[Statement]:
        """Statements logged after ``since`` (a log_mark), each with its start and end time."""
        with self.log.open("rb") as handle:
            handle.seek(since)
            text = handle.read().decode(errors="replace")
        found: list[Statement] = []
        running: dict[int, int] = {}
        for line in text.splitlines():
            match = _LINE.match(line)
            if match is None:
                if line.startswith("\t") and found and found[-1].end is None:  # a statement's next line
                    last = found[-1]
                    found[-1] = Statement(last.pid, last.start, None, f"{last.sql} {line.strip()}")
                continue
            stamp = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
            pid, kind, rest = int(match[2]), match[3] or match[5], match[4]
            if kind != "duration":
                running[pid] = len(found)
                found.append(Statement(pid, stamp, None, rest))
            elif pid in running:
                i = running.pop(pid)
                found[i] = Statement(pid, found[i].start, stamp, found[i].sql)
        return [Statement(s.pid, s.start, s.end, _unwrap(" ".join(s.sql.split()))) for s in found]


def _unwrap(sql: str) -> str:
    """The query itself: the driver reads results through ``COPY (query) TO STDOUT``."""
    match = _COPY.match(sql)
    return match[1] if match else sql


def _as_postgres(*args: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120)


@contextmanager
def running_postgres(**settings: str) -> Iterator[PgServer]:
    """PostgreSQL 15 as the ``postgres`` user (it refuses root) on a free loopback port, every
    statement logged, removed afterwards. The superuser logs in without a password; role ``reader``
    needs one (scram-sha-256). ``settings`` are added to postgresql.conf."""
    root = Path(tempfile.mkdtemp(prefix="timelake-pg-"))
    shutil.chown(root, "postgres")
    data = root / "data"
    _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    (data / "pg_hba.conf").write_text(
        "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    server = PgServer(root, free_port())
    conf = {"port": str(server.port), "listen_addresses": "'127.0.0.1'", "unix_socket_directories": f"'{root}'",
            "log_statement": "'all'", "log_min_duration_statement": "0", "log_line_prefix": "'%m [%p] '",
            "log_timezone": "'UTC'", "fsync": "off", **settings}
    with (data / "postgresql.conf").open("a") as handle:
        handle.writelines(f"{key} = {value}\n" for key, value in conf.items())
    _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(server.log), "-w", "start")
    try:
        server.sql("CREATE DATABASE timelake", db="postgres")
        server.sql(f"CREATE ROLE reader LOGIN PASSWORD '{READER_PASSWORD}'")
        yield server
    finally:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    with running_postgres() as server:
        yield server


def year_start() -> datetime:
    """Midnight UTC 400 days ago: a year of history that ends well before today and stays in retention."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=400)


@pytest.fixture(scope="session")
def readings_table(postgres: PgServer) -> str:
    """``public.readings``: a hypertable-shaped table (ts, device_id, value), a year at 1 h cadence for
    20 devices with a 30-day gap, indexed on time. Returns its name."""
    start = year_start()
    postgres.sql(f"""
        CREATE TABLE readings AS
        SELECT '{start.isoformat()}'::timestamptz + h * interval '1 hour' AS ts,
               'd' || lpad(d::text, 2, '0') AS device_id,
               round(((h * 7 + d * 13) % 1000)::numeric / 10, 1)::float8 AS value
        FROM generate_series(0, 365 * 24 - 1) AS h, generate_series(0, 19) AS d
        WHERE NOT (h >= 100 * 24 AND h < 130 * 24)""")
    postgres.sql("CREATE INDEX ON readings (ts)")
    postgres.sql("ANALYZE readings")
    postgres.sql("GRANT SELECT ON readings TO reader")
    return "public.readings"
