"""A real `timelake` process killed at each step boundary, then resumed, publishes the exact table once.

Each crash test runs the CLI in a subprocess armed with TIMELAKE_CRASH_AT (the process exits 137 at
that point, with no cleanup), checks what main looks like at the moment of the crash, then runs
`timelake backfill resume JOB` and compares the table with a merge computed independently by DuckDB.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.runner.scenario import (
    BRANCH_PREFIX, CHUNK_PROPERTY, JOB_PROPERTY, RANGE_START, STEP_PROPERTY, TABLE, assert_same_rows, json_out,
    key_counts, main_history, main_rows, main_snapshot_id, merge_reference, publish_snapshots, refs, run_backfill,
    run_cli, seeded, us, write_source,
)
from timelake.interfaces.lake import Lake

DAYS = 6  # 4 devices x 6 days x 30 min = 1152 source rows, one unit per day


@dataclass
class Scenario:
    lake: Lake
    warehouse: Path
    source: str
    original: pa.Table
    reference: pa.Table
    parts: list[pa.Table]

    @property
    def new_rows(self) -> int:
        return self.reference.num_rows - self.original.num_rows

    @property
    def source_duplicates(self) -> int:
        rows = pa.concat_tables(self.parts)
        return rows.num_rows - len(key_counts(rows))

    @property
    def source_keys_on_main(self) -> int:
        return len(key_counts(pa.concat_tables(self.parts)).keys() & key_counts(self.original).keys())


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    lake, warehouse, original, parts, source = seeded(tmp_path, DAYS)
    s = Scenario(lake, warehouse, source, original, merge_reference(original, parts), parts)
    # the data exercises every merge rule (new keys, later source rows win, existing rows win)
    assert s.new_rows > 0 and s.source_duplicates > 0 and s.source_keys_on_main > 0
    return s


def _only_job(lake: Lake) -> str:
    jobs = lake.jobs(TABLE)
    assert len(jobs) == 1, [j.id for j in jobs]
    return jobs[0].id


def _assert_finished(s: Scenario, job_id: str) -> None:
    """The end state every successful run must reach."""
    assert_same_rows(main_rows(s.lake), s.reference)
    assert len(publish_snapshots(s.lake, job_id)) == 1
    assert BRANCH_PREFIX + job_id not in refs(s.lake)
    assert s.lake.runtime.store.leases() == []
    assert s.lake.job(job_id).record().phase == "published"


# crash point -> the phase the job store must show after the process died there
CRASH_POINTS = {
    "plan.done": "planned",
    "write.unit:2": "writing",
    "stage.committed": "written",
    "stage.done": "staged",
    "publish.committed": "publishing",
}


@pytest.mark.parametrize("crash_at", list(CRASH_POINTS))
def test_crash_at_each_step_then_resume_publishes_the_exact_table_once(scenario: Scenario, crash_at: str) -> None:
    s = scenario
    main_before = main_snapshot_id(s.lake)

    crashed = run_backfill(s.warehouse, s.source, crash_at=crash_at)
    assert crashed.returncode == 137, f"expected a crash at {crash_at}; stderr: {crashed.stderr[-2000:]}"
    job_id = _only_job(s.lake)
    job = s.lake.job(job_id).record()
    assert job.phase == CRASH_POINTS[crash_at]
    assert [lease.job_id for lease in s.lake.runtime.store.leases()] == [job_id], "the unfinished job keeps its range"
    assert BRANCH_PREFIX + job_id in refs(s.lake)
    if crash_at == "write.unit:2":
        done = [u for u in s.lake.runtime.store.units(job_id) if u.status == "done"]
        assert len(done) == 2 and job.state["units_total"] == DAYS
    if crash_at == "stage.committed":
        head = s.lake.table(TABLE).iceberg.snapshot_by_name(BRANCH_PREFIX + job_id)
        assert head.summary[JOB_PROPERTY] == job_id and head.summary[STEP_PROPERTY] == "stage"
        assert "staged_snapshot_id" not in job.state

    if crash_at == "publish.committed":
        # the main commit happened, the state update did not: the rows are there exactly once
        assert_same_rows(main_rows(s.lake), s.reference)
        assert len(publish_snapshots(s.lake, job_id)) == 1
    else:
        assert main_snapshot_id(s.lake) == main_before, "main moved before publish"
        assert_same_rows(main_rows(s.lake), s.original)
        assert publish_snapshots(s.lake, job_id) == []
    main_at_crash = main_snapshot_id(s.lake)

    resumed = run_cli(s.warehouse, "backfill", "resume", job_id, "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json_out(resumed)
    assert report["phase"] == "published"
    assert report["rows_written"] == s.new_rows
    assert report["rows_duplicate_in_source"] == s.source_duplicates
    assert report["rows_conflicting_existing"] == s.source_keys_on_main
    _assert_finished(s, job_id)
    assert report["published_snapshot_ids"] == [p.snapshot_id for p in publish_snapshots(s.lake, job_id)]
    if crash_at == "publish.committed":
        assert main_snapshot_id(s.lake) == main_at_crash, "resume committed to main again"


def _backfill_in_process(s: Scenario) -> str:
    """The same job through the Python API (saves a process start; the CLI runs it the same way)."""
    job = s.lake.table(TABLE).backfill(s.source, max_concurrency=1, wait=True).wait()
    _assert_finished(s, job.id)
    return job.id


def test_resuming_a_published_job_changes_nothing(scenario: Scenario) -> None:
    s = scenario
    job_id = _backfill_in_process(s)
    assert job_id == _only_job(s.lake)
    snapshot, history = main_snapshot_id(s.lake), [x.snapshot_id for x in main_history(s.lake)]

    again = run_cli(s.warehouse, "backfill", "resume", job_id, "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json_out(again)["phase"] == "published"
    assert main_snapshot_id(s.lake) == snapshot
    assert [x.snapshot_id for x in main_history(s.lake)] == history
    _assert_finished(s, job_id)


def test_running_the_same_backfill_twice_changes_nothing_the_second_time(scenario: Scenario) -> None:
    s = scenario
    first_job = _backfill_in_process(s)
    snapshot = main_snapshot_id(s.lake)

    second = run_backfill(s.warehouse, s.source)
    assert second.returncode == 0, second.stderr[-2000:]
    report = json_out(second)
    assert report["job_id"] != first_job
    assert report["phase"] == "published"
    assert report["rows_written"] == 0
    assert report["published_snapshot_ids"] == []
    assert main_snapshot_id(s.lake) == snapshot
    assert publish_snapshots(s.lake, report["job_id"]) == []
    assert_same_rows(main_rows(s.lake), s.reference)
    assert not any(r.startswith(BRANCH_PREFIX) for r in refs(s.lake))
    assert s.lake.runtime.store.leases() == []
    assert len(publish_snapshots(s.lake, first_job)) == 1


def test_crash_between_publish_chunks_resumes_without_committing_a_chunk_twice(scenario: Scenario) -> None:
    """publish_by=day: the process dies right after the second day's commit; resume publishes the
    remaining days and finds the first two already on main (exactly once per chunk)."""
    s = scenario
    crashed = run_backfill(s.warehouse, s.source, "--publish-by", "day", crash_at="publish.committed:2")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    job_id = _only_job(s.lake)
    early = publish_snapshots(s.lake, job_id)
    assert [p.summary[CHUNK_PROPERTY] for p in early] == ["2024-03-01T00:00:00Z", "2024-03-02T00:00:00Z"]
    on_main = key_counts(main_rows(s.lake))
    assert max(on_main.values()) == 1
    expected_days = set(key_counts(s.original)) | {
        k for k in key_counts(s.reference) if k[1] < us(RANGE_START + timedelta(days=2))}
    assert set(on_main) == expected_days

    resumed = run_cli(s.warehouse, "backfill", "resume", job_id, "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json_out(resumed)["rows_written"] == s.new_rows
    assert_same_rows(main_rows(s.lake), s.reference)
    chunks = [p.summary[CHUNK_PROPERTY] for p in publish_snapshots(s.lake, job_id)]
    assert chunks == [f"2024-03-{d:02d}T00:00:00Z" for d in range(1, DAYS + 1)]
    assert [p.snapshot_id for p in publish_snapshots(s.lake, job_id)[:2]] == [p.snapshot_id for p in early]
    assert BRANCH_PREFIX + job_id not in refs(s.lake)
    assert s.lake.runtime.store.leases() == []


def _by_day(parts: list[pa.Table]) -> list[pa.Table]:
    """The export rewritten as a file per day, each day's rows in the order the parts had them."""
    rows = pa.concat_tables(parts)
    days = pc.divide(pc.cast(rows.column("ts"), pa.int64()), 86_400_000_000).to_numpy()
    return [rows.filter(pa.array(days == day)) for day in sorted(set(days.tolist()))]


# crash point -> the phase the job store must show after the process died there
DIRECT_CRASH_POINTS = {"scan.direct:3": "scanning", "plan.done": "planned", "stage.committed": "written"}


@pytest.mark.parametrize("crash_at", list(DIRECT_CRASH_POINTS))
def test_day_files_the_scan_writes_itself_survive_a_crash_and_publish_once(tmp_path: Path, crash_at: str) -> None:
    """A file per day: the scan task writes each day's file itself (no spill, no write step). Killed
    after its third file, after the cut, or after staging, the job resumes to the exact table once."""
    lake, warehouse, original, parts, _ = seeded(tmp_path, DAYS)
    days = _by_day(parts)
    source = write_source(tmp_path / "days", days)
    reference = merge_reference(original, days)
    main_before = main_snapshot_id(lake)

    crashed = run_backfill(warehouse, source, crash_at=crash_at)
    assert crashed.returncode == 137, f"expected a crash at {crash_at}; stderr: {crashed.stderr[-2000:]}"
    job_id = _only_job(lake)
    job = lake.job(job_id).record()
    assert job.phase == DIRECT_CRASH_POINTS[crash_at] and job.state["direct_partitions"] == DAYS
    assert main_snapshot_id(lake) == main_before and publish_snapshots(lake, job_id) == []

    resumed = run_cli(warehouse, "backfill", "resume", job_id, "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json_out(resumed)
    assert report["phase"] == "published" and all(c["passed"] for c in report["checks"])
    units = lake.runtime.store.units(job_id)
    assert len(units) == DAYS and all(u.info.get("direct") for u in units)
    assert_same_rows(main_rows(lake), reference)
    assert len(publish_snapshots(lake, job_id)) == 1 and lake.runtime.store.leases() == []
