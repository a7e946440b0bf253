"""Bad input: a clear error naming what is wrong, and main untouched."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import recent
from timelake.errors import DstRefused, LeaseConflict, TableNotFound, ValidationFailed
from timelake.sources.base import SourceError
from timelake.sources.mapping import MappingError


@pytest.fixture
def seeded(sensor, readings):
    sensor.append(readings(recent(10), days=1, devices=2))
    return sensor


def _untouched(table: timelake.Table, before) -> None:
    after = table.refresh().iceberg.metadata
    assert [s.snapshot_id for s in after.snapshots] == [s.snapshot_id for s in before.snapshots]
    assert set(after.refs) == set(before.refs) | {r for r in after.refs if r.startswith("backfill/")}
    assert after.refs["main"] == before.refs["main"]


def _fails(table, match: str, exc=Exception, **kwargs) -> timelake.Job:
    before = table.refresh().iceberg.metadata
    job = table.backfill(**kwargs)
    with pytest.raises(exc, match=match):
        job.wait()
    _untouched(table, before)
    return job


def test_naive_times_without_tz(seeded, tmp_path):
    path = tmp_path / "naive.parquet"
    pq.write_table(pa.table({"ts": pa.array([1_700_000_000_000_000], pa.timestamp("us")), "device_id": ["a"], "value": [1.0]}), path)
    job = _fails(seeded, "naive timestamps.*tz", MappingError, source=str(path))
    assert job.record().phase == "failed"


def test_mapped_column_missing(seeded, readings, tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(readings(recent(5)), path)
    _fails(seeded, "tag_name", MappingError, source=str(path), map={"device_id": "tag_name"})


def test_uncastable_value_names_column_file_and_row(seeded, tmp_path):
    path = tmp_path / "bad.csv"
    pacsv.write_csv(pa.table({"ts": [f"{recent(5)}T00:00:00Z", f"{recent(5)}T01:00:00Z"], "device_id": ["a", "a"],
                              "value": ["1.5", "abc"]}), path)
    job = _fails(seeded, r"value.*bad\.csv.*row 1.*abc|value.*abc.*bad\.csv", MappingError, source=str(path))
    assert "abc" in job.record().state["error"]


def test_empty_source(seeded, tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"ts": pa.array([], pa.timestamp("us", tz="UTC")), "device_id": pa.array([], pa.string()),
                             "value": pa.array([], pa.float64())}), path)
    _fails(seeded, "has no rows", timelake.InvalidJob, source=str(path))


def test_corrupt_parquet(seeded, tmp_path):
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"PAR1 this is not parquet at all")
    _fails(seeded, "corrupt.parquet", SourceError, source=str(path))


def test_unknown_table(lake, readings):
    with pytest.raises(TableNotFound, match="iot.nope"):
        lake.table("iot.nope")


def test_start_not_before_end(seeded, readings):
    with pytest.raises(ValueError, match="must be before end"):
        seeded.backfill(source=readings(recent(5)), start=recent(3), end=recent(4))


def test_overlapping_second_job_is_refused(seeded, readings, lake):
    first = seeded.backfill(source=readings(recent(6), days=3), max_concurrency=1)
    first.wait()
    # hold a lease as an unpublished job would
    from timelake.model.timeutil import parse_instant, to_micros
    from timelake.ports.store import Lease

    lake.runtime.store.acquire_lease(Lease("iot.sensor", to_micros(parse_instant(recent(6))), to_micros(parse_instant(recent(3))), "bf-held"))
    before = seeded.refresh().iceberg.metadata
    job = seeded.backfill(source=readings(recent(5), days=1, seed=9))
    with pytest.raises(LeaseConflict, match="bf-held"):
        job.wait()
    assert seeded.refresh().iceberg.metadata.refs["main"] == before.refs["main"]
    # a disjoint range is fine
    seeded.backfill(source=readings(recent(2), days=1, seed=9)).wait()


def test_nonexistent_local_time_refused_by_default(seeded, tmp_path):
    path = tmp_path / "dst.csv"
    pacsv.write_csv(pa.table({"ts": ["2026-03-29 02:30:00", "2026-03-29 03:30:00"], "device_id": ["a", "a"], "value": ["1", "2"]}), path)
    job = _fails(seeded, "dst_nonexistent", DstRefused, source=str(path), tz="Europe/Berlin")
    dry = seeded.backfill(source=str(path), tz="Europe/Berlin", dry_run=True).wait().report()
    assert dry["rows_rejected"]["reasons"] == {"dst_nonexistent": 1}
    assert job.record().phase == "failed"


def test_failed_assertion_keeps_branch_and_main(seeded, readings, lake):
    before = seeded.refresh().iceberg.metadata
    job = seeded.backfill(source=readings(recent(5), days=1), assertions=["SELECT * FROM staged WHERE value > 50"])
    with pytest.raises(ValidationFailed, match="assertion_1"):
        job.wait()
    report = job.report()
    failed = next(c for c in report["checks"] if c["name"] == "assertion_1")
    assert not failed["passed"] and failed["samples"] and failed["samples"][0]["value"] > 50
    table = seeded.refresh().iceberg
    assert table.metadata.refs["main"] == before.refs["main"]
    assert f"backfill/{job.id}" in table.metadata.refs
    assert report["phase"] == "failed_validation"
    assert lake.runtime.store.leases() == []


def test_assertion_cannot_read_files(seeded, readings, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    job = seeded.backfill(source=readings(recent(5), days=1), assertions=[f"SELECT * FROM read_csv('{secret}')"])
    with pytest.raises(ValidationFailed):
        job.wait()
    check = next(c for c in job.report()["checks"] if c["name"] == "assertion_1")
    assert "could not run" in check["detail"] and not check["passed"]


def test_passing_assertion(seeded, readings):
    report = seeded.backfill(source=readings(recent(5), days=1),
                             assertions=["SELECT * FROM staged WHERE value < 0 OR value > 100"]).wait().report()
    assert report["phase"] == "published"
    assert next(c for c in report["checks"] if c["name"] == "assertion_1")["passed"]


def test_source_file_missing(seeded, tmp_path):
    _fails(seeded, "no source files match", SourceError, source=str(tmp_path / "nothing" / "*.parquet"))
