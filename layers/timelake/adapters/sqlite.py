"""The embedded job store: jobs, units, leases and rate budgets in one SQLite file beside the warehouse."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Unpack

from timelake.ports.runtime import private_file, private_folder
from timelake.ports.store import (
    RATE_BURST_SECONDS, Guard, JobRecord, JobState, Lease, Phase, UnitRecord, accept, apply_update, job_busy, job_exists,
    job_not_found, lease_conflict, reserve, unit_not_found,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, phase TEXT NOT NULL,
    spec TEXT NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    phase_log TEXT NOT NULL DEFAULT '[]');
CREATE TABLE IF NOT EXISTS units (job_id TEXT NOT NULL, unit_id TEXT NOT NULL, status TEXT NOT NULL,
    info TEXT NOT NULL, result TEXT NOT NULL, PRIMARY KEY (job_id, unit_id));
CREATE TABLE IF NOT EXISTS leases (job_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, start_us INTEGER NOT NULL,
    end_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rates (job_id TEXT PRIMARY KEY, empty_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rate_settings (job_id TEXT PRIMARY KEY, rows_per_second REAL NOT NULL);
CREATE TABLE IF NOT EXISTS progress (job_id TEXT NOT NULL, item TEXT NOT NULL, counts TEXT NOT NULL,
    PRIMARY KEY (job_id, item));
"""


class SqliteJobStore:
    """Job state in one SQLite file beside the warehouse; safe across the writer processes (WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        private_folder(Path(self.path).parent)
        private_file(Path(self.path))
        self._local = threading.local()
        con = self._con()
        con.executescript(_SCHEMA)
        if "phase_log" not in {row[1] for row in con.execute("PRAGMA table_info(jobs)")}:  # a job store from before the log
            try:
                con.execute("ALTER TABLE jobs ADD COLUMN phase_log TEXT NOT NULL DEFAULT '[]'")
            except sqlite3.OperationalError as exc:  # another process opening the store added it first
                if "duplicate column" not in str(exc):
                    raise
        self._runs = Path(self.path).parent / "runs"

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA busy_timeout=60000")
            self._local.con = con
        return con

    def _tx(self) -> _Tx:
        return _Tx(self._con())

    def create_job(self, job: JobRecord) -> None:
        now = time.time()
        log = [[job.phase, round(now, 3)]]
        with self._tx() as con:
            try:
                con.execute(
                    "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?)",
                    (job.job_id, job.table, job.phase, json.dumps(job.spec), json.dumps(job.state), now, now, json.dumps(log)),
                )
            except sqlite3.IntegrityError as exc:
                raise job_exists(job.job_id) from exc

    def get_job(self, job_id: str) -> JobRecord:
        row = self._con().execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        if row is None:
            raise job_not_found(job_id)
        return _job(row)

    def update_job(self, job_id: str, phase: Phase | None = None, **state: Unpack[JobState]) -> JobRecord:
        return self.update_job_if(job_id, accept, phase, **state)

    def update_job_if(self, job_id: str, guard: Guard, phase: Phase | None = None, **state: Unpack[JobState]) -> JobRecord:
        with self._tx() as con:
            row = con.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            if row is None:
                raise job_not_found(job_id)
            job = _job(row)
            guard(job)
            apply_update(job, phase, state, time.time())
            con.execute(
                "UPDATE jobs SET phase=?, state=?, updated_at=?, phase_log=? WHERE job_id=?",
                (job.phase, json.dumps(job.state), job.updated_at, json.dumps(job.phase_log), job_id),
            )
        return job

    def list_jobs(self, table: str | None = None) -> list[JobRecord]:
        sql = "SELECT * FROM jobs"
        args: tuple[str, ...] = ()
        if table:
            sql, args = sql + " WHERE tbl=?", (table,)
        return [_job(r) for r in self._con().execute(sql + " ORDER BY created_at", args)]

    def put_units(self, job_id: str, units: list[UnitRecord]) -> None:
        with self._tx() as con:
            con.executemany(
                "INSERT OR IGNORE INTO units VALUES (?,?,?,?,?)",
                [(job_id, u.unit_id, u.status, json.dumps(u.info), json.dumps(u.result)) for u in units],
            )

    def units(self, job_id: str) -> list[UnitRecord]:
        rows = self._con().execute(
            "SELECT unit_id, info, status, result FROM units WHERE job_id=? ORDER BY unit_id", (job_id,)
        )
        return [UnitRecord(r[0], json.loads(r[1]), r[2], json.loads(r[3])) for r in rows]

    def unit(self, job_id: str, unit_id: str) -> UnitRecord:
        row = self._con().execute(
            "SELECT unit_id, info, status, result FROM units WHERE job_id=? AND unit_id=?", (job_id, unit_id)
        ).fetchone()
        if row is None:
            raise unit_not_found(job_id, unit_id)
        return UnitRecord(row[0], json.loads(row[1]), row[2], json.loads(row[3]))

    def job_and_unit(self, job_id: str, unit_id: str) -> tuple[JobRecord, UnitRecord]:
        return self.get_job(job_id), self.unit(job_id, unit_id)

    def complete_unit(self, job_id: str, unit_id: str, result: dict[str, Any]) -> bool:
        with self._tx() as con:
            cur = con.execute(
                "UPDATE units SET status='done', result=? WHERE job_id=? AND unit_id=? AND status!='done'",
                (json.dumps(result), job_id, unit_id),
            )
            return cur.rowcount == 1

    def reopen_units(self, job_id: str, unit_ids: list[str]) -> None:
        with self._tx() as con:
            con.executemany("UPDATE units SET status='pending', result='{}' WHERE job_id=? AND unit_id=?",
                            [(job_id, unit_id) for unit_id in unit_ids])

    def acquire_lease(self, lease: Lease) -> None:
        with self._tx() as con:
            other = con.execute(
                "SELECT job_id FROM leases WHERE tbl=? AND start_us<? AND end_us>? AND job_id!=?",
                (lease.table, lease.end, lease.start, lease.job_id),
            ).fetchone()
            if other:
                raise lease_conflict(lease, other[0])
            con.execute("INSERT OR REPLACE INTO leases VALUES (?,?,?,?)", (lease.job_id, lease.table, lease.start, lease.end))

    def release_lease(self, job_id: str) -> None:
        with self._tx() as con:
            con.execute("DELETE FROM leases WHERE job_id=?", (job_id,))

    def leases(self, table: str | None = None) -> list[Lease]:
        sql = "SELECT tbl, start_us, end_us, job_id FROM leases"
        args: tuple[str, ...] = ()
        if table:
            sql, args = sql + " WHERE tbl=?", (table,)
        return [Lease(*r) for r in self._con().execute(sql, args)]

    def reserve_rows(self, job_id: str, rows: int, rows_per_second: float, now: float | None = None) -> float:
        with self._tx() as con:
            row = con.execute("SELECT empty_at FROM rates WHERE job_id=?", (job_id,)).fetchone()
            rate = con.execute("SELECT rows_per_second FROM rate_settings WHERE job_id=?", (job_id,)).fetchone()
            now = time.time() if now is None else now
            empty_at = reserve(row[0] if row else None, now, rows, rows_per_second, rate[0] if rate else None)
            if empty_at is None:
                return 0.0
            con.execute("INSERT OR REPLACE INTO rates VALUES (?,?)", (job_id, empty_at))
        return empty_at - now - RATE_BURST_SECONDS

    def set_rate(self, job_id: str, rows_per_second: int) -> None:
        with self._tx() as con:
            con.execute("INSERT OR REPLACE INTO rate_settings VALUES (?,?)", (job_id, rows_per_second))

    def note_progress(self, job_id: str, item: str, counts: dict[str, Any]) -> None:
        with self._tx() as con:
            con.execute("INSERT OR REPLACE INTO progress VALUES (?,?,?)", (job_id, item, json.dumps(counts)))

    def progress_notes(self, job_id: str) -> dict[str, dict[str, Any]]:
        rows = self._con().execute("SELECT item, counts FROM progress WHERE job_id=?", (job_id,))
        return {item: json.loads(counts) for item, counts in rows}

    @contextmanager
    def hold(self, job_id: str) -> Iterator[None]:
        """An exclusive ``flock`` on ``runs/<job_id>.lock`` beside the database: the kernel drops it
        with the process, so a job whose runner was killed is never shown as running."""
        fd = self._lock_file(job_id)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise job_busy(job_id) from None
        try:
            yield
        finally:
            os.close(fd)

    def running(self, job_id: str) -> bool:
        if not (self._runs / f"{job_id}.lock").exists():
            return False
        fd = self._lock_file(job_id)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock taken just now
        return False

    def _lock_file(self, job_id: str) -> int:
        private_folder(self._runs)
        return os.open(self._runs / f"{job_id}.lock", os.O_CREAT | os.O_RDWR, 0o600)


class _Tx:
    """BEGIN IMMEDIATE … COMMIT, so check-then-write (leases, unit completion) is atomic across processes."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        self.con.execute("BEGIN IMMEDIATE")
        return self.con

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.con.execute("ROLLBACK" if exc_type else "COMMIT")


def _job(row: tuple) -> JobRecord:
    return JobRecord(row[0], row[1], Phase(row[2]), json.loads(row[3]), json.loads(row[4]), row[5], row[6], json.loads(row[7]))
