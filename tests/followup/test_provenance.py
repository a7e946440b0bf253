"""Every published backfill is recorded: in timelake.backfills and in the publish snapshot's summary."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from tests.conftest import cli, recent
from timelake.followup.provenance import job_hash



def test_history_lists_every_published_job_with_correct_counts(lake, sensor, readings, tmp_path, warehouse):
    existing = readings(recent(8), days=1, devices=2)
    sensor.append(existing)
    source = readings(recent(8), days=3, devices=2)
    path = tmp_path / "export.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.concat_tables([source, source.slice(0, 5)]), path)
    first = sensor.backfill(source=str(path), publish_by="day").wait().report()
    second = sensor.backfill(source=readings(recent(3), days=1, devices=2), mode="append").wait().report()
    sensor.backfill(source=readings(recent(2), days=1), dry_run=True).wait()  # not published: not in history

    history = sensor.history()
    assert history.column("job_id").to_pylist() == [first["job_id"], second["job_id"]]
    row = history.to_pylist()[0]
    assert (row["rows_in_source"], row["rows_written"], row["rows_duplicate_in_source"], row["rows_conflicting_existing"]) == (
        source.num_rows + 5, source.num_rows - existing.num_rows, 5, existing.num_rows)
    assert row["mode"] == "merge" and row["chunks"] == 3 and row["source_uri"] == str(path)
    assert row["snapshot_ids"] == first["published_snapshot_ids"] and len(row["snapshot_ids"]) == 2
    assert row["job_hash"] == job_hash(json.loads(row["job_json"])) and row["source_fingerprint"]
    assert row["range_start"].strftime("%Y-%m-%d") == recent(8) and row["range_end"].strftime("%Y-%m-%d") == recent(5)

    # the publish snapshots carry the same facts
    table = sensor.refresh().iceberg
    for snapshot_id in row["snapshot_ids"]:
        summary = table.snapshot_by_id(snapshot_id).summary
        assert summary["timelake.job-id"] == first["job_id"] and summary["timelake.mode"] == "merge"
        assert summary["timelake.job-hash"] == row["job_hash"] and summary["timelake.source"] == str(path)
        assert summary["timelake.engine-version"] == row["engine_version"]

    # queryable as an ordinary Iceberg table
    backfills = lake.catalog.load_table("timelake.backfills").scan().to_arrow()  # noqa: F841
    assert duckdb.sql("SELECT sum(rows_written) FROM backfills WHERE table_name = 'iot.sensor'").fetchall()[0][0] == (
        first["rows_written"] + second["rows_written"])

    listed = json.loads(cli("backfill", "history", "iot.sensor", "--json", warehouse=warehouse).stdout)
    assert [r["job_id"] for r in listed] == [first["job_id"], second["job_id"]]


def test_resume_after_publish_records_history_once(lake, sensor, readings):
    job = sensor.backfill(source=readings(recent(4), days=1)).wait()
    job.resume(wait=True)
    from timelake.followup.provenance import record

    record(lake.runtime, lake.runtime.store.get_job(job.id), lake.runtime.store.units(job.id))
    assert sensor.history().num_rows == 1
