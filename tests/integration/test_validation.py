"""The checks catch staged data that does not match what the units wrote (steps driven one by one)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from timelake.errors import ValidationFailed
from timelake.plan import cut, pending_pieces, plan, scan
from timelake.spec import JobSpec
from timelake.stage import stage
from timelake.validate import validate
from timelake.write import write_unit

from tests.conftest import recent


def _staged_job(lake, sensor, source) -> tuple[str, str]:
    rt = lake.runtime
    job = lake.create_job(JobSpec(table="iot.sensor", source="<pyarrow.Table>"))
    plan(rt, job.id, source)
    for piece in pending_pieces(rt, job.id):
        scan(rt, job.id, piece, source)
    cut(rt, job.id)
    for unit in rt.store.units(job.id):
        write_unit(rt, job.id, unit.unit_id)
    stage(rt, job.id)
    path = rt.store.units(job.id)[0].result["path"]
    return job.id, path.removeprefix("file://")


def test_clean_staging_passes_every_check(lake, sensor, readings):
    job_id, _ = _staged_job(lake, sensor, readings(recent(4), days=1, devices=3))
    assert validate(lake.runtime, job_id)["passed"]
    checks = {c["name"]: c["passed"] for c in lake.runtime.store.get_job(job_id).state["checks"]}
    assert checks == {"row_count_balance": True, "staged_files_match_units": True, "time_bounds": True,
                      "required_not_null": True, "files_sorted": True, "unique_keys_in_staged": True,
                      "no_overlap_with_main": True, "aggregate_matches_source": True}


def test_tampered_file_fails_sorting_uniqueness_and_aggregate(lake, sensor, readings):
    job_id, path = _staged_job(lake, sensor, readings(recent(4), days=1, devices=3))
    rows = pq.read_table(path)
    ts = rows.column("ts").to_pylist()
    ts[1] = ts[0]  # a duplicate key, same row count
    values = pc.add(rows.column("value"), 1.0)
    tampered = pa.table({"ts": pa.array(ts, rows.schema.field("ts").type), "device_id": rows.column("device_id"),
                         "value": values}, schema=rows.schema)
    pq.write_table(tampered.take(pa.array(range(tampered.num_rows - 1, -1, -1))), path)  # and out of order
    with pytest.raises(ValidationFailed, match="files_sorted, unique_keys_in_staged, aggregate_matches_source"):
        validate(lake.runtime, job_id)
    job = lake.runtime.store.get_job(job_id)
    failed = {c["name"]: c for c in job.state["checks"] if not c["passed"]}
    assert set(failed) == {"files_sorted", "unique_keys_in_staged", "aggregate_matches_source"}
    assert failed["unique_keys_in_staged"]["samples"][0]["device_id"] == "d00"
    assert job.phase == "failed_validation" and sensor.to_arrow().num_rows == 0
    assert f"backfill/{job_id}" in sensor.refresh().iceberg.metadata.refs
