"""The job store contract: every implementation (SQLite here, DynamoDB on AWS) must pass it."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from tests.aws_fixtures import aws, dynamo_table, moto_server  # noqa: F401
from timelake.adapters.sqlite import SqliteJobStore
from timelake.aws.store import DynamoJobStore
from timelake.errors import JobNotFound, LeaseConflict
from timelake.ports.store import RATE_BURST_SECONDS, JobRecord, Lease, Phase, UnitRecord


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request, tmp_path):
    if request.param == "sqlite":
        return SqliteJobStore(tmp_path / "jobs.db")
    request.getfixturevalue("aws")
    return DynamoJobStore(dynamo_table("jobs"))


def test_job_lifecycle(store):
    store.create_job(JobRecord("j1", "iot.a", "created", {"mode": "merge"}))
    with pytest.raises(ValueError, match="already exists"):
        store.create_job(JobRecord("j1", "iot.a", "created", {}))
    job = store.update_job("j1", "planned", rows_in_source=10)
    assert (job.phase, job.state) == ("planned", {"rows_in_source": 10})
    job = store.update_job("j1", columns_filled_with_null=["a", "b"])
    assert store.get_job("j1").state == {"rows_in_source": 10, "columns_filled_with_null": ["a", "b"]}
    assert job.phase == "planned"
    with pytest.raises(TypeError, match="rows_in_sourse"):  # a misspelt key is refused, nothing is written
        store.update_job("j1", "written", rows_in_sourse=11, units_total=2)
    assert store.get_job("j1").phase == "planned" and "units_total" not in store.get_job("j1").state
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
    job, unit = store.job_and_unit("j", "u1")
    assert (job.job_id, job.phase, unit.unit_id, unit.status, unit.result) == ("j", "planned", "u1", "done", {"rows": 5})
    with pytest.raises(JobNotFound, match="u9"):
        store.job_and_unit("j", "u9")
    with pytest.raises(JobNotFound, match="nope"):
        store.job_and_unit("nope", "u1")


def test_reopened_units_are_pending_again_and_complete_once_more(store):
    store.create_job(JobRecord("j", "iot.a", "written", {}))
    store.put_units("j", [UnitRecord("u1", {"p": 1}), UnitRecord("u2", {"p": 2})])
    store.complete_unit("j", "u1", {"path": "a"})
    store.complete_unit("j", "u2", {"path": "b"})
    store.reopen_units("j", ["u1"])
    assert [(u.unit_id, u.status, u.result, u.info) for u in store.units("j")] == [
        ("u1", "pending", {}, {"p": 1}), ("u2", "done", {"path": "b"}, {"p": 2})]
    assert store.complete_unit("j", "u1", {"path": "a2"}) is True
    assert store.complete_unit("j", "u1", {"path": "a3"}) is False
    assert store.unit("j", "u1").result == {"path": "a2"}


def test_overlapping_lease_refused_adjacent_allowed(store):
    store.acquire_lease(Lease("iot.a", 100, 200, "j1"))
    with pytest.raises(LeaseConflict, match="j1"):
        store.acquire_lease(Lease("iot.a", 150, 250, "j2"))
    store.acquire_lease(Lease("iot.a", 200, 300, "j2"))  # [start, end) ranges touch but do not overlap
    store.acquire_lease(Lease("iot.b", 100, 200, "j3"))  # another table
    store.acquire_lease(Lease("iot.a", 100, 200, "j1"))  # re-acquiring your own lease is idempotent
    assert sorted(lease.job_id for lease in store.leases("iot.a")) == ["j1", "j2"]
    store.release_lease("j1")
    store.acquire_lease(Lease("iot.a", 150, 180, "j4"))
    assert sorted(lease.job_id for lease in store.leases()) == ["j2", "j3", "j4"]


def test_missing_records_raise_job_not_found(store):
    store.create_job(JobRecord("j", "iot.a", "planned", {}))
    with pytest.raises(JobNotFound, match="nope"):
        store.update_job("nope", "planned")
    with pytest.raises(JobNotFound, match="no unit 'u9'"):
        store.unit("j", "u9")
    assert store.complete_unit("j", "u9", {}) is False
    assert store.units("j") == [] and store.leases() == []


def test_replanning_many_units_keeps_their_progress(store):
    """~1.2 MB of units: more than one page of a DynamoDB query; re-planning skips existing units."""
    info = {"files": ["x" * 8000]}
    store.create_job(JobRecord("j", "iot.a", "planned", {}))
    store.put_units("j", [UnitRecord(f"u{i:03d}", info) for i in range(0, 150, 2)])
    assert store.complete_unit("j", "u042", {"rows": 42})
    store.put_units("j", [UnitRecord(f"u{i:03d}", info | {"replanned": True}) for i in range(150)])
    units = store.units("j")
    assert [u.unit_id for u in units] == [f"u{i:03d}" for i in range(150)]
    assert (units[42].status, units[42].result, units[42].info) == ("done", {"rows": 42}, info)
    assert units[43].info["replanned"] and sum(u.status == "done" for u in units) == 1


def test_concurrent_state_updates_all_land(store):
    store.create_job(JobRecord("j", "iot.a", "writing", {}))
    keys = ["rows_in_source", "rows_in_scope", "rows_outside_range", "rows_outside_retention", "units_total", "files",
            "files_deleted", "rows_replaced"]
    threads = [threading.Thread(target=store.update_job, args=("j",), kwargs={key: i}) for i, key in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get_job("j").state == {key: i for i, key in enumerate(keys)}


def _race(kind: type, location: str, job: str, barrier) -> bool:
    store = kind(location)  # each racer with its own connection
    barrier.wait()
    try:
        store.acquire_lease(Lease("iot.a", int(job[1:]) * 10, 100, job))
        return True
    except LeaseConflict:
        return False


def _racers(store, race, prefix: str) -> list[bool]:
    """Four forked processes run ``race(store kind, location, name, barrier)`` at once; who won."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            location = store.path if isinstance(store, SqliteJobStore) else store.table_name
            return pool.starmap(race, [(type(store), location, f"{prefix}{i}", barrier) for i in range(4)])


def test_a_lease_cannot_be_taken_twice_by_racing_processes(store):
    """Forked, not spawned: the children see the moto endpoint in the environment as it is now and
    start in milliseconds (spawning re-imports the engine)."""
    store.acquire_lease(Lease("iot.b", 0, 100, "other"))  # the racers update an existing lease record
    won = _racers(store, _race, "j")
    assert sum(won) == 1 and [lease.job_id for lease in store.leases("iot.a")] == [f"j{won.index(True)}"]


def test_row_reservations_queue_up_per_job(store):
    """A new budget starts empty (no opening burst); each reservation waits behind the ones before
    it, also when earlier ones were not waited for. The store is given the time (``now``), so what it
    answers is exact: how long the caller waits from that instant."""
    began = 1_800_000_000.0

    def wait(job: str, rows: int, after: float = 0.0) -> float:
        return store.reserve_rows(job, rows, 1000.0, now=began + after)

    assert wait("j", 500) == pytest.approx(0.5)
    assert wait("j", 500) == pytest.approx(1.0)
    assert wait("other", 100) == pytest.approx(0.1)  # a budget per job
    assert wait("j", 500, after=0.3) == pytest.approx(1.2)  # behind the first two: due at 1.5
    # The budget ran out meanwhile: a worker that paused may catch up by RATE_BURST_SECONDS' worth of rows.
    assert wait("j", 500, after=5.0) == pytest.approx(0.5 - RATE_BURST_SECONDS)
    assert wait("j", 1000, after=5.0) == pytest.approx(1.5 - RATE_BURST_SECONDS)


#: 1,000 rows at one row per 1,000 s: each reservation moves the budget by 10^6 s, so however slow the
#: machine, elapsed wall time is noise next to one lost reservation
ROWS, RATE, STEP = 1000, 0.001, 1_000_000


def _reserve(kind: type, location: str, barrier) -> None:
    store = kind(location)
    barrier.wait()
    for _ in range(10):
        store.reserve_rows("j", ROWS, RATE)


def test_racing_processes_lose_no_reservation(store):
    """Four processes make 10 reservations each: the budget then runs out 40 steps after the first
    reservation; one lost update would show as a whole step missing. No speed is asserted."""
    ctx = multiprocessing.get_context("fork")
    location = store.path if isinstance(store, SqliteJobStore) else store.table_name
    began = time.time()
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            pool.starmap(_reserve, [(type(store), location, barrier)] * 4)
    ahead = store.reserve_rows("j", 0, RATE) + (time.time() - began)
    assert round(ahead / STEP) == 40, ahead


class _Taken(Exception):
    pass


def _claim(kind: type, location: str, who: str, barrier) -> bool:
    """Take the job's approval slot unless someone holds it: the check and the write are one step."""
    store = kind(location)
    barrier.wait()

    def free(job: JobRecord) -> None:
        if job.state.get("approval_token"):
            raise _Taken(job.state["approval_token"])

    try:
        store.update_job_if("j", free, approval_token=who)
    except _Taken:
        return False
    return True


def test_a_guarded_update_writes_only_what_its_guard_accepts(store):
    """Abort and publish decide who goes first through ``update_job_if``: a refusing guard writes
    nothing, and of four processes racing for one slot exactly one gets it."""
    store.create_job(JobRecord("j", "iot.a", Phase.VALIDATED, {}, {"files": 1}))
    seen = []
    job = store.update_job_if("j", lambda j: seen.append(dict(j.state)), Phase.PUBLISHING, publish_committed=True)
    assert seen == [{"files": 1}]
    assert (job.phase, job.state) == (Phase.PUBLISHING, {"files": 1, "publish_committed": True})

    def refuse(job: JobRecord) -> None:
        raise _Taken("no")

    with pytest.raises(_Taken):
        store.update_job_if("j", refuse, "published", publish_committed=False)
    assert (store.get_job("j").phase, store.get_job("j").state) == (Phase.PUBLISHING, {"files": 1, "publish_committed": True})
    assert type(store.get_job("j").phase) is Phase  # read back as the enum, whichever store
    with pytest.raises(JobNotFound):
        store.update_job_if("nope", lambda j: None, publish_committed=True)
    won = _racers(store, _claim, "p")
    assert sum(won) == 1 and store.get_job("j").state["approval_token"] == f"p{won.index(True)}"


def test_the_phases_a_job_enters_are_logged_with_their_time(store):
    before = time.time()
    store.create_job(JobRecord("j", "iot.a", "created", {}))
    store.update_job("j", "scanning", rows_in_source=1)
    store.update_job("j", rows_in_source=2)  # no phase: nothing entered
    store.update_job("j", "scanning")  # entered again (a resumed step): a new stretch
    job = store.update_job("j", "planned")
    assert [phase for phase, _ in job.phase_log] == ["created", "scanning", "scanning", "planned"]
    times = [at for _, at in store.get_job("j").phase_log]
    assert times == sorted(times) and before - 0.01 <= times[0] and times[-1] <= time.time() + 0.01
    assert store.get_job("j").state == {"rows_in_source": 2}  # the log is the store's, not the job's state


def test_progress_notes_are_one_record_per_item(store):
    store.create_job(JobRecord("j", "iot.a", "scanning", {}))
    assert store.progress_notes("j") == {}
    store.note_progress("j", "scan/0", {"rows": 10, "pieces": 0})
    store.note_progress("j", "scan/1", {"rows": 5})
    store.note_progress("j", "scan/0", {"rows": 20, "pieces": 1})  # replaces, never adds up
    store.note_progress("other", "scan/0", {"rows": 99})
    assert store.progress_notes("j") == {"scan/0": {"rows": 20, "pieces": 1}, "scan/1": {"rows": 5}}
    assert store.units("j") == []  # notes are not units


def _hold_until_killed(location: str, held) -> None:
    store = SqliteJobStore(location)
    with store.hold("j"):
        held.set()
        time.sleep(600)


def test_a_held_job_runs_until_its_process_dies(tmp_path):
    """The embedded store tells a running job from one whose runner died, SIGKILL included; a second
    holder is refused while the first lives."""
    import signal

    from timelake.errors import JobBusy

    store = SqliteJobStore(tmp_path / "jobs.db")
    store.create_job(JobRecord("j", "iot.a", "writing", {}))
    assert store.running("j") is False
    ctx = multiprocessing.get_context("fork")
    held = ctx.Event()
    child = ctx.Process(target=_hold_until_killed, args=(store.path, held))
    child.start()
    assert held.wait(30)
    assert store.running("j") is True
    with pytest.raises(JobBusy, match="job j is running in another process"), store.hold("j"):
        pass
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert store.running("j") is False
    with store.hold("j"):
        assert store.running("j") is True  # another handle in this very process sees it held
    assert store.running("j") is False


def test_a_job_store_from_before_the_phase_log_opens_and_logs(tmp_path):
    import sqlite3

    path = tmp_path / "jobs.db"
    con = sqlite3.connect(path)
    con.executescript("""CREATE TABLE jobs (job_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, phase TEXT NOT NULL,
        spec TEXT NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL);
        INSERT INTO jobs VALUES ('j', 'iot.a', 'writing', '{}', '{"rows": 1}', 1.0, 2.0);""")
    con.close()
    store = SqliteJobStore(path)
    assert (store.get_job("j").state, store.get_job("j").phase_log) == ({"rows": 1}, [])
    assert [phase for phase, _ in store.update_job("j", "written").phase_log] == ["written"]
    assert SqliteJobStore(path).get_job("j").phase == "written"  # opened again: nothing to add


def test_a_rate_set_on_the_job_governs_its_readers_next_reservations(store):
    """Readers keep the rate they started with; `set_rate` (``timelake backfill set``) overrides it for
    every later reservation of that job, 0 lifting the limit, and the budget keeps its place throughout.
    Times are given (``now``), so the expected waits follow from the bucket's rule alone: a reservation
    starts where the last one ended (a new budget one second from now) and waits until a second before
    its end."""
    now = 1_000_000.0
    assert store.reserve_rows("j", 500, 1000.0, now) == pytest.approx(0.5)  # ends at now + 1.5
    store.set_rate("j", 100)
    assert store.reserve_rows("j", 500, 1000.0, now) == pytest.approx(5.5)  # 500 rows at 100/s: ends at now + 6.5
    store.set_rate("j", 0)
    assert store.reserve_rows("j", 10**9, 1000.0, now) == 0.0  # no limit: nothing reserved
    store.set_rate("j", 1000)
    assert store.reserve_rows("j", 500, 1.0, now) == pytest.approx(6.0)  # ends at now + 7
    assert store.reserve_rows("other", 500, 1000.0, now) == pytest.approx(0.5)  # the rate is the job's alone
