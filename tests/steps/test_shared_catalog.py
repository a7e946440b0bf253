"""The embedded catalog shared with another engine: a commit waits for a lock another connection holds
on the catalog's SQLite file (Iceberg's JdbcCatalog does, during its own commits), and a job that fails
for any reason holds no lease until it is resumed."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

import timelake
from tests.conftest import recent, sort_rows
from timelake.errors import LeaseConflict
from timelake.model import faults
from timelake.ports import runtime


def test_a_commit_waits_for_a_lock_another_engine_holds_on_the_catalog(warehouse, readings, monkeypatch):
    monkeypatch.setattr(runtime, "CATALOG_BUSY_SECONDS", 1.0)  # the lock below outlasts a whole busy wait
    lake = timelake.connect(warehouse=warehouse)
    sensor = lake.create_table("iot.sensor", schema=readings(recent(3)).schema, time_column="ts",
                               series_key=["device_id"], partition_by="day")
    rows = readings(recent(6), days=2, devices=2)
    held = threading.Event()

    def hold_the_catalog() -> None:  # a reader's SHARED lock, as JdbcCatalog takes while it loads a table
        other = sqlite3.connect(warehouse / "catalog.db", isolation_level=None)
        other.execute("BEGIN")
        other.execute("SELECT count(*) FROM iceberg_tables").fetchall()
        held.set()
        time.sleep(2.5)
        other.execute("COMMIT")
        other.close()

    def lock_before_publish() -> None:
        thread = threading.Thread(target=hold_the_catalog)
        thread.start()
        held.wait(5)

    started = time.monotonic()
    with faults.at("publish.started", lock_before_publish):
        job = sensor.backfill(source=rows, wait=True)
    assert job.record().phase == "published", job.record().state.get("error")
    assert time.monotonic() - started > 2.0  # it did wait for the lock
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(rows))


def _failed_job(lake, sensor, rows):
    """A job that failed after staging (its object store went away), holding no lease."""
    def fail() -> None:
        raise OSError("the object store went away")

    with faults.at("stage.committed", fail), pytest.raises(OSError, match="went away"):
        sensor.backfill(source=rows).wait()
    return lake.jobs()[0]


def test_a_failed_job_releases_its_lease_and_takes_it_back_on_resume(lake, sensor, readings):
    rows = readings(recent(6), days=2, devices=2)
    failed = _failed_job(lake, sensor, rows)
    assert failed.record().phase == "failed" and lake.leases() == []
    assert not lake.is_range_leased("iot.sensor", recent(6), recent(4))

    other = sensor.backfill(source=readings(recent(5), days=1, devices=1, value_offset=1000)).wait()
    assert other.record().phase == "published" and lake.leases() == []

    failed.resume(wait=True)
    assert failed.record().phase == "published" and lake.leases() == []
    expected = sort_rows(rows)
    table = sort_rows(sensor.to_arrow())
    assert table.num_rows == expected.num_rows  # the other job's rows were there first and won in merge mode
    assert table.filter(table["value"].to_numpy() >= 1000).num_rows == 24


def test_resume_refuses_in_one_line_while_another_job_holds_the_range(lake, sensor, readings):
    failed = _failed_job(lake, sensor, readings(recent(6), days=2, devices=2))
    holder = sensor.backfill(source=readings(recent(5), days=1, devices=1), canary=True).wait()
    assert holder.record().phase == "awaiting-approval"
    with pytest.raises(LeaseConflict, match=holder.id):
        failed.resume(wait=True)
    assert failed.record().phase == "failed"
