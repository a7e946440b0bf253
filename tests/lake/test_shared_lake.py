"""A backfill in a shared lake: real Iceberg Java (Spark) expires, removes orphans, compacts, rewrites
manifests, inserts and alters the table around every state a job can be in, and no row is lost,
doubled or kept that should have gone.

Each scenario stops a job where an operator would meet it (published; a canary waiting; killed at a
chunk boundary, between write and stage, or with validation done), runs the other engine's operations,
lets the job go on (resume, continue, abort), and then checks: Spark and plain pyiceberg read exactly
the rows an independent DuckDB computation expects; no file that any remaining snapshot references is
missing; the job's branch and marker are gone. A "kill" here is an exception that is not an
`Exception` raised at the named crash point: nothing after that point runs, no failure is recorded,
exactly as when the process dies (tests/runner/test_crash_resume.py kills real processes).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import timelake
from tests.lake.spark import SparkLake, missing_files
from tests.runner.scenario import (
    RANGE_START, TABLE, assert_same_rows, canonical, merge_reference, readings, table_of, us, write_source,
)
from timelake.errors import BackfillError
from timelake.interfaces.lake import Job, Lake
from timelake.model import faults
from timelake.model.commit import published_property

DAYS = 4
DAY_US = 86_400_000_000


class Killed(BaseException):
    """The process dies here: not an Exception, so no handler of the engine sees it."""


def kill_at(point: str, nth: int = 1) -> AbstractContextManager[None]:
    """A crash point armed to kill at its ``nth`` pass."""
    passes = [0]

    def hook() -> None:
        passes[0] += 1
        if passes[0] == nth:
            raise Killed(point)

    return faults.at(point, hook)


def killed(job: Job) -> None:
    with pytest.raises(Killed):
        job.wait()


@pytest.fixture
def seeded(lake: Lake, tmp_path: Path) -> dict[str, object]:
    """iot.sensor with two days before the range and some rows inside it; the export to backfill over
    DAYS days (with duplicates in the source and keys that exist on main)."""
    table = lake.create_table(TABLE, schema=readings(RANGE_START, 1, 0).schema, time_column="ts",
                              series_key=["device_id"], partition_by="day")
    original = pa.concat_tables([
        readings(RANGE_START - timedelta(days=2), 2, value_base=1_000_000),
        readings(RANGE_START + timedelta(days=1), 0.25, value_base=2_000_000, devices=2),
    ])
    table.append(original)
    base = readings(RANGE_START, DAYS, value_base=0)
    fixes = table_of(pc.cast(base.column("ts").slice(10, 5), pa.int64()).to_numpy(),
                     base.column("device_id").slice(10, 5).to_pylist(), 500_000 + pa.array(range(5)).to_numpy())
    parts = [base, fixes]
    return {"table": table, "original": original, "parts": parts, "source": write_source(tmp_path / "export", parts)}


def live_rows(day: int, value_base: float, nth: int = 0, fresh: bool = False) -> pa.Table:
    """Rows the ``nth`` insert of a live Spark writer adds: the first hours of ``day`` after the range
    start, of devices the backfill also has (other values for its keys) or, ``fresh``, of a device of
    their own; and one row after the range."""
    inside = readings(RANGE_START + timedelta(days=day), 0.125, value_base=value_base, devices=2)
    if fresh:
        inside = inside.set_column(1, "device_id", pc.replace_substring(inside["device_id"], "dev-", "live-"))
    after = readings(RANGE_START + timedelta(days=30, hours=nth), 0.02, value_base=value_base + 10_000, devices=1)
    return pa.concat_tables([inside, after])


def assert_exact(lake: Lake, spark: SparkLake, expected: pa.Table) -> None:
    """Spark and pyiceberg read ``expected`` (its three columns); nothing referenced is missing; no job
    left a branch or a marker behind."""
    assert_same_rows(canonical(spark.rows(TABLE)), expected)
    assert_same_rows(canonical(spark.pyiceberg_table(TABLE).scan().to_arrow()), expected)
    table = spark.pyiceberg_table(TABLE)
    assert missing_files(table) == []
    assert [r for r in table.metadata.refs if r != "main"] == []
    assert not [k for k in table.properties if k.startswith("timelake.published.")]


def replace_reference(existing: pa.Table, live: list[pa.Table], parts: list[pa.Table]) -> pa.Table:
    """Replace mode, computed independently: every row outside the range (``existing`` at the plan and
    ``live`` rows inserted since), and inside it the live rows plus the last source row of each key
    they do not have."""
    everything = canonical(pa.concat_tables([existing, *live]))
    outside = everything.filter(pc.invert(pc.is_in(pc.cast(everything["ts"], pa.int64()),
                                                   pc.cast(in_range(everything)["ts"], pa.int64()))))
    inside = merge_reference(in_range(canonical(pa.concat_tables(live))) if live else existing.schema.empty_table(), parts)
    return canonical(pa.concat_tables([outside, inside]))


def only_days(rows: pa.Table, days: set[int]) -> pa.Table:
    day = pc.cast(rows.column("ts"), pa.int64()).to_numpy() // DAY_US
    return rows.filter(pa.array([d in days for d in day.tolist()]))


def in_range(rows: pa.Table) -> pa.Table:
    ts = pc.cast(rows.column("ts"), pa.int64()).to_numpy()
    lo = us(RANGE_START)
    return rows.filter(pa.array((ts >= lo) & (ts < lo + DAYS * DAY_US)))


def maintain(spark: SparkLake, *ops: str, live: list[pa.Table] | None = None, day: int = 0, fresh: bool = False) -> None:
    """Another engine's operations on the table, in order. An insert lands in ``day`` of the range (keys
    of the backfill, unless ``fresh``: a live writer that inserts a key after the backfill published it
    makes its own duplicate) and is added to ``live``."""
    for op in ops:
        if op == "insert":
            n = len(live or [])
            rows = live_rows(day, value_base=9_000_000 + 1_000 * n, nth=n, fresh=fresh)
            spark.insert(TABLE, rows)
            assert live is not None
            live.append(rows)
        elif op == "compact":
            spark.rewrite_data_files(TABLE, **{"min-input-files": "2"})
        elif op == "manifests":
            spark.rewrite_manifests(TABLE)
        elif op == "expire":
            spark.expire_snapshots(TABLE, retain_last=1)
        elif op == "orphans":
            spark.remove_orphan_files(TABLE)
        else:
            raise AssertionError(op)


MAINTENANCE = ("insert", "compact", "manifests", "expire", "orphans")


def test_a_published_table_stays_exact_through_every_operation(lake, spark, seeded):
    job = seeded["table"].backfill(source=seeded["source"], publish_by="day", max_concurrency=1).wait()
    assert job.record().phase == "published"
    expected = merge_reference(seeded["original"], seeded["parts"])
    assert_exact(lake, spark, expected)
    live: list[pa.Table] = []
    for op in MAINTENANCE:
        maintain(spark, op, live=live, day=2, fresh=True)
        assert_exact(lake, spark, merge_reference(pa.concat_tables([seeded["original"], *live]), seeded["parts"]))
    spark.add_column(TABLE, "site", "string")
    spark.add_partition_field(TABLE, "bucket(4, device_id)")
    expected = merge_reference(pa.concat_tables([seeded["original"], *live]), seeded["parts"])
    assert_exact(lake, spark, expected)
    assert set(pc.unique(spark.rows(TABLE).column("site")).to_pylist()) == {None}
    # a job planned now would have to write a spec that also buckets by device: refused in one line
    again = seeded["table"].backfill(source=seeded["source"])
    with pytest.raises(BackfillError, match=r"also partitions by bucket\[4\]\(device_id\)"):
        again.wait()
    assert_exact(lake, spark, expected)


def test_a_waiting_canary_continues_after_main_moved_on_and_its_base_expired(lake, spark, seeded):
    job = seeded["table"].backfill(source=seeded["source"], canary=True).wait()
    assert job.record().phase == "awaiting-approval"
    base = job.record().state["base_snapshot_id"]
    live: list[pa.Table] = []
    maintain(spark, *MAINTENANCE, live=live, day=0)  # the canary's own day gets live rows
    spark.add_column(TABLE, "site", "string")
    table = spark.pyiceberg_table(TABLE)
    assert table.snapshot_by_id(base) is None and f"backfill/{job.id}" in table.metadata.refs
    job.approve(wait=True)
    assert job.record().phase == "published", job.record().state.get("error")
    assert_exact(lake, spark, merge_reference(pa.concat_tables([seeded["original"], *live]), seeded["parts"]))


@pytest.mark.parametrize("boundary", [1, 3])
def test_a_chunked_job_killed_at_chunk_boundaries_resumes_then_aborts_exactly(lake, spark, seeded, boundary):
    """Killed right after a chunk's commit (before the job store heard of it), twice, with maintenance
    that expires the commit's snapshot between: each chunk lands once; abort then keeps exactly the
    chunks on main and deletes only files no snapshot references."""
    table, live = seeded["table"], []
    with kill_at("publish.committed", boundary):
        job = table.backfill(source=seeded["source"], publish_by="day", max_concurrency=1)
        killed(job)
    maintain(spark, "insert", "expire", live=live, day=3)  # another commit to main, then the marker snapshot expires
    with kill_at("publish.committed", 1):
        killed(job.resume())
    maintain(spark, "compact", "manifests", "expire", "orphans", live=live)
    result = job.abort()
    record = job.record()
    on_main = boundary + 1
    assert record.phase == "aborted" and len(record.state["chunks_on_main"]) == on_main
    days = {us(RANGE_START) // DAY_US + d for d in range(on_main)}
    existing = pa.concat_tables([seeded["original"], *live])
    expected = merge_reference(existing, [only_days(p, days) for p in seeded["parts"]])
    assert_exact(lake, spark, expected)
    # the unpublished units' files are gone; a published chunk's file stays while a snapshot references
    # it (a compaction may have replaced it: then abort removes it with the branch that still held it)
    units = {u.info["start"] // DAY_US: Path(u.result["path"].removeprefix("file://")) for u in lake.runtime.store.units(job.id)}
    assert not any(path.exists() for day, path in units.items() if day not in days)
    assert result["files_deleted"] >= DAYS - on_main and result["files_deleted"] + result["files_kept_on_main"] <= DAYS
    assert lake.leases() == []


def test_a_chunked_job_killed_after_a_commit_whose_snapshot_expired_publishes_each_chunk_once(lake, spark, seeded):
    table, live = seeded["table"], []
    with kill_at("publish.committed", 3):
        job = table.backfill(source=seeded["source"], publish_by="day", max_concurrency=1)
        killed(job)
    maintain(spark, "insert", "expire", "compact", "manifests", "orphans", live=live, day=3)
    job.resume(wait=True)
    assert job.record().phase == "published"
    expected = merge_reference(pa.concat_tables([seeded["original"], *live]), seeded["parts"])
    assert_exact(lake, spark, expected)
    assert sorted(job.record().state["published_chunks"]) == sorted(
        (RANGE_START + timedelta(days=d)).isoformat().replace("+00:00", "Z") for d in range(DAYS))


def test_replace_after_a_compaction_swaps_out_the_compacted_rows(lake, spark, seeded):
    """The compaction's files hold rows that were there at the plan: replace takes them over like the
    files they replaced; a live insert into the range meanwhile stays and wins."""
    table, live = seeded["table"], []
    spark.insert(TABLE, readings(RANGE_START + timedelta(days=1, hours=12), 0.25, value_base=3_000_000, devices=2))
    spark_before = spark.rows(TABLE)
    old_in_range = in_range(canonical(spark_before))
    with kill_at("publish.started"):
        job = table.backfill(source=seeded["source"], mode="replace", max_concurrency=1)
        killed(job)
    compacted = spark.rewrite_data_files(TABLE, **{"min-input-files": "2"})
    assert compacted["rewritten_data_files_count"] >= 2
    maintain(spark, "insert", "manifests", "expire", "orphans", live=live, day=2)
    job.resume(wait=True)
    assert job.record().state["rows_replaced"] == old_in_range.num_rows
    assert_exact(lake, spark, replace_reference(canonical(spark_before), live, seeded["parts"]))


def test_unit_files_removed_before_staging_are_written_again(lake, spark, seeded, tmp_path):
    """Killed between write and stage, the job's files are orphans to Spark: removed, then written
    again by the resume, from the spill and by re-running the scan task that wrote a day itself."""
    base = readings(RANGE_START, DAYS, value_base=0)
    days = [only_days(base, {us(RANGE_START) // DAY_US + d}) for d in range(2)]  # a file per day: written by the scan
    rest = only_days(base, {us(RANGE_START) // DAY_US + d for d in range(2, DAYS)})  # several days: spilled
    source = write_source(tmp_path / "mixed", [*days, rest])
    with kill_at("stage.started"):
        job = seeded["table"].backfill(source=source, max_concurrency=1)
        killed(job)
    state = job.record().state
    assert state["direct_partitions"] == 2
    paths = [u.result["path"] for u in lake.runtime.store.units(job.id)]
    removed = spark.remove_orphan_files(TABLE)
    assert sorted(Path(p.removeprefix("file:")).name for p in removed) == sorted(Path(p).name for p in paths)
    job.resume(wait=True)
    assert job.record().phase == "published", job.record().state.get("error")
    assert_exact(lake, spark, merge_reference(seeded["original"], [base]))


def test_a_branch_dropped_by_someone_is_staged_again_on_resume(lake, spark, seeded):
    with kill_at("stage.done"):
        job = seeded["table"].backfill(source=seeded["source"], max_concurrency=1)
        killed(job)
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} DROP BRANCH `backfill/{job.id}`")
    maintain(spark, "expire", "orphans")
    with pytest.raises(BackfillError, match=rf"branch backfill/{job.id} was removed from table iot.sensor by someone else"):
        job.resume(wait=True)
    job.resume(wait=True)
    assert job.record().phase == "published"
    assert_exact(lake, spark, merge_reference(seeded["original"], seeded["parts"]))


@pytest.mark.parametrize("mode", ["merge", "replace"])
def test_schema_and_spec_changed_by_spark_between_plan_and_publish(lake, spark, seeded, mode):
    with kill_at("publish.started"):
        job = seeded["table"].backfill(source=seeded["source"], mode=mode, publish_by="day", max_concurrency=1)
        killed(job)
    spark.add_column(TABLE, "site", "string")
    spark.add_partition_field(TABLE, "bucket(4, device_id)")
    rows = live_rows(3, 8_000_000)
    live = [rows.append_column("site", pa.array(["plant-7"] * rows.num_rows))]
    spark.insert(TABLE, live[0])
    job.resume(wait=True)
    assert job.record().phase == "published", job.record().state.get("error")
    plain = canonical(live[0])
    expected = (merge_reference(pa.concat_tables([seeded["original"], plain]), seeded["parts"]) if mode == "merge"
                else replace_reference(seeded["original"], [plain], seeded["parts"]))
    assert_exact(lake, spark, expected)
    sites = spark.rows(TABLE).select(["site"]).column("site").to_pylist()
    assert sites.count("plant-7") == live[0].num_rows and sites.count(None) == len(sites) - live[0].num_rows


def test_a_dropped_column_is_refused_in_one_line_and_abort_leaves_main_as_spark_left_it(lake, spark, seeded):
    with kill_at("publish.started"):
        job = seeded["table"].backfill(source=seeded["source"], max_concurrency=1)
        killed(job)
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} DROP COLUMN value")
    before = spark.rows(TABLE)
    with pytest.raises(BackfillError, match=r"column 'value' was dropped in table iot.sensor .* abort the job"):
        job.resume(wait=True)
    assert spark.rows(TABLE).num_rows == before.num_rows
    job.abort()
    table = spark.pyiceberg_table(TABLE)
    assert missing_files(table) == [] and list(table.metadata.refs) == ["main"]
    assert spark.rows(TABLE).num_rows == before.num_rows


def test_commits_wait_for_a_spark_application_that_holds_the_catalog_open(lake, spark, seeded, warehouse, monkeypatch):
    """Iceberg's JdbcCatalog keeps a read open on the SQLite file for as long as it lives: the engine's
    commits wait for it and retry, and go through once Spark lets go."""
    from timelake.model import commit
    from timelake.ports import runtime

    done, locked = threading.Event(), threading.Event()
    seen_locked = []

    def hold(held_for: float) -> None:
        with spark.held():
            spark.rows(TABLE)
            locked.set()
            done.wait(held_for)

    def held_from_now() -> None:  # the publish goes on once Spark holds the file, however long its read took
        holder.start()
        assert locked.wait(120), "Spark did not read the table"

    original = commit.is_conflict

    def watching(exc: BaseException) -> bool:
        if "database is locked" in str(exc):
            seen_locked.append(exc)
        return original(exc)

    monkeypatch.setattr(commit, "is_conflict", watching)
    monkeypatch.setattr(runtime, "CATALOG_BUSY_SECONDS", 0.5)
    fresh = timelake.connect(warehouse=warehouse)
    holder = threading.Thread(target=hold, args=(3.0,))
    with faults.at("publish.started", held_from_now):
        job = fresh.table(TABLE).backfill(source=seeded["source"]).wait()
    holder.join()
    assert job.record().phase == "published" and seen_locked
    assert_exact(lake, spark, merge_reference(seeded["original"], seeded["parts"]))


def test_the_marker_is_a_table_property_while_a_job_publishes(lake, spark, seeded):
    with kill_at("publish.committed", 2):
        job = seeded["table"].backfill(source=seeded["source"], publish_by="day", max_concurrency=1)
        killed(job)
    second = (RANGE_START + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert spark.pyiceberg_table(TABLE).properties[published_property(job.id)] == second
    job.resume(wait=True)
    assert published_property(job.id) not in spark.pyiceberg_table(TABLE).properties



def test_a_value_column_renamed_by_spark_is_found_by_its_field_id(lake, spark, seeded):
    with kill_at("publish.started"):
        job = seeded["table"].backfill(source=seeded["source"], max_concurrency=1)
        killed(job)
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} RENAME COLUMN value TO reading")
    job.resume(wait=True)
    assert job.record().phase == "published"
    rows = spark.rows(TABLE).rename_columns(["ts", "device_id", "value"])
    assert_same_rows(canonical(rows), merge_reference(seeded["original"], seeded["parts"]))
    assert missing_files(spark.pyiceberg_table(TABLE)) == []


@pytest.mark.parametrize("expired", [False, True])
def test_replace_keeps_the_live_rows_a_compaction_folded_in_with_old_ones(lake, spark, seeded, expired):
    """A live insert into the range, then a compaction that merges it with the range's old rows into one
    file: replace removes the old rows and keeps the live ones (read from the files the compaction
    replaced). Once the compaction's snapshot has expired that cannot be told any more, and the whole
    compacted file counts as live: no row is dropped on a guess."""
    with kill_at("publish.started"):
        job = seeded["table"].backfill(source=seeded["source"], mode="replace", max_concurrency=1)
        killed(job)
    live = readings(RANGE_START + timedelta(days=1, hours=12), 0.125, value_base=7_000_000, devices=2)
    spark.insert(TABLE, live)
    assert spark.rewrite_data_files(TABLE, **{"min-input-files": "2"})["rewritten_data_files_count"] >= 2
    if expired:
        maintain(spark, "expire", "orphans")
    job.resume(wait=True)
    folded = [live, in_range(canonical(seeded["original"]))] if expired else [live]
    assert_exact(lake, spark, replace_reference(seeded["original"], folded, seeded["parts"]))
