"""What a backfill leaves in the table metadata is safe under other engines' maintenance.

After merge, replace, a chunked publish, a canary and its continue, and an abort, expiring every
snapshot but the current one the way Java's ExpireSnapshots does (Spark ``expire_snapshots``,
Athena ``VACUUM``, the Glue optimizer) would delete no file main reads, and no snapshot left in the
metadata points at a deleted file.
"""

from __future__ import annotations

from tests.conftest import recent, stage_job
from tests.steps.java_expiry import (
    assert_safe_for_other_engines, dangling_snapshots, files_deleted_by_expiring_all_but_current, live_files,
)
from timelake.model.commit import JOB_PROPERTY
from timelake.model.faults import at


def _job_snapshots(table, job_id: str) -> list[str]:
    return sorted((s.summary or {}).get("timelake.step", "") for s in table.refresh().snapshots()
                  if (s.summary or {}).get(JOB_PROPERTY) == job_id)


def test_every_kind_of_job_leaves_metadata_other_engines_can_expire(lake, sensor, readings):
    sensor.append(readings(recent(20), days=2, devices=2))
    table = sensor.iceberg
    job = sensor.backfill(source=readings(recent(16), days=3, devices=2)).wait()
    assert _job_snapshots(table, job.id) == ["publish"]  # the staging snapshot is gone from the metadata
    assert_safe_for_other_engines(table)

    job = sensor.backfill(source=readings(recent(15), days=2, devices=2, seed=1), mode="replace",
                          start=recent(15), end=recent(13)).wait()
    assert set(_job_snapshots(table, job.id)) == {"publish"}
    assert_safe_for_other_engines(table)

    job = sensor.backfill(source=readings(recent(11), days=3, devices=2), publish_by="day").wait()
    assert _job_snapshots(table, job.id) == ["publish"] * 3
    assert_safe_for_other_engines(table)

    job = sensor.backfill(source=readings(recent(8), days=2, devices=2), canary=True).wait()
    assert _job_snapshots(table, job.id) == ["stage-canary"]
    job.approve(wait=True)
    assert job.record().phase == "published" and _job_snapshots(table, job.id) == ["publish"]
    assert_safe_for_other_engines(table)

    job_id = stage_job(lake, readings(recent(5), days=2, devices=2))
    lake.job(job_id).abort()
    assert _job_snapshots(table, job_id) == []  # no dangling staging snapshot whose files abort deleted
    assert_safe_for_other_engines(table)
    assert sensor.refresh().to_arrow().num_rows == 10 * 24 * 2  # ten distinct days of 2 devices, hourly


def test_the_rule_sees_a_staging_snapshot_that_outlives_its_publish(lake, sensor, readings):
    """Positive control: while a publish is between its chunk commit and the end of the step, the
    staging snapshot is still in the metadata, and expiring it the Java way would delete the files
    main just received; the step removes it before it ends."""
    seen = []

    def look() -> None:
        table = sensor.refresh().iceberg
        seen.append((files_deleted_by_expiring_all_but_current(table) & live_files(table), dangling_snapshots(table)))

    with at("publish.chunk", look):
        sensor.backfill(source=readings(recent(6), days=2, devices=2)).wait()
    assert len(seen) == 1 and len(seen[0][0]) == 2 and seen[0][1] == []
    assert_safe_for_other_engines(sensor.iceberg)
