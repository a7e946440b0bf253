"""The job store contract: every implementation (SQLite here, DynamoDB on AWS) must pass it."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from timelake.errors import JobNotFound, LeaseConflict
from timelake.store import JobRecord, Lease, SqliteJobStore, UnitRecord


@pytest.fixture(params=["sqlite"])
def store(request, tmp_path):
    return SqliteJobStore(tmp_path / "jobs.db")


def test_job_lifecycle(store):
    store.create_job(JobRecord("j1", "iot.a", "created", {"mode": "merge"}))
    with pytest.raises(ValueError, match="already exists"):
        store.create_job(JobRecord("j1", "iot.a", "created", {}))
    job = store.update_job("j1", "planned", rows=10)
    assert (job.phase, job.state) == ("planned", {"rows": 10})
    job = store.update_job("j1", extra=[1, 2])
    assert store.get_job("j1").state == {"rows": 10, "extra": [1, 2]} and job.phase == "planned"
    store.create_job(JobRecord("j2", "iot.b", "created", {}))
    assert [j.job_id for j in store.list_jobs()] == ["j1", "j2"]
    assert [j.job_id for j in store.list_jobs("iot.b")] == ["j2"]
    with pytest.raises(JobNotFound):
        store.get_job("nope")


def test_unit_completes_exactly_once(store):
    store.create_job(JobRecord("j", "iot.a", "planned", {}))
    store.put_units("j", [UnitRecord("u1", {"p": 1}), UnitRecord("u2", {"p": 2})])
    store.put_units("j", [UnitRecord("u1", {"p": 99})])  # re-planning does not reset a unit
    assert store.complete_unit("j", "u1", {"rows": 5}) is True
    assert store.complete_unit("j", "u1", {"rows": 6}) is False
    assert store.unit("j", "u1").result == {"rows": 5} and store.unit("j", "u1").info == {"p": 1}
    assert [(u.unit_id, u.status) for u in store.units("j")] == [("u1", "done"), ("u2", "pending")]


def test_overlapping_lease_refused_adjacent_allowed(store):
    store.acquire_lease(Lease("iot.a", 100, 200, "j1"))
    with pytest.raises(LeaseConflict, match="j1"):
        store.acquire_lease(Lease("iot.a", 150, 250, "j2"))
    store.acquire_lease(Lease("iot.a", 200, 300, "j2"))  # [start, end) ranges touch but do not overlap
    store.acquire_lease(Lease("iot.b", 100, 200, "j3"))  # another table
    store.acquire_lease(Lease("iot.a", 100, 200, "j1"))  # re-acquiring your own lease is idempotent
    assert sorted(l.job_id for l in store.leases("iot.a")) == ["j1", "j2"]
    store.release_lease("j1")
    store.acquire_lease(Lease("iot.a", 150, 180, "j4"))
    assert sorted(l.job_id for l in store.leases()) == ["j2", "j3", "j4"]


def _race(path: str, job: str, barrier) -> bool:
    store = SqliteJobStore(path)
    barrier.wait()
    try:
        store.acquire_lease(Lease("iot.a", 0, 100, job))
        return True
    except LeaseConflict:
        return False


def test_a_lease_cannot_be_taken_twice_by_racing_processes(tmp_path):
    path = str(tmp_path / "race.db")
    SqliteJobStore(path)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            won = pool.starmap(_race, [(path, f"j{i}", barrier) for i in range(4)])
    assert sum(won) == 1
