"""Event time end to end (DST in Europe/Berlin) and the final layout (partition tiers by age)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tests.conftest import SCHEMA, make_readings, sort_rows


@pytest.fixture
def berlin_csv(tmp_path):
    """Naive Berlin wall-clock times around both 2025 DST transitions (retention-safe: the table keeps P3Y)."""
    local = ["2025-03-30 01:30:00", "2025-03-30 01:59:00", "2025-03-30 03:00:00", "2025-03-30 03:30:00",
             "2025-10-26 01:30:00", "2025-10-26 03:30:00", "2025-07-01 12:00:00", "2025-01-15 12:00:00"]
    path = tmp_path / "berlin.csv"
    pacsv.write_csv(pa.table({"timestamp": local, "tag": ["a"] * len(local), "val": [str(i) for i in range(len(local))]}), path)
    return path


UTC_EXPECTED = ["2025-03-30T00:30:00", "2025-03-30T00:59:00", "2025-03-30T01:00:00", "2025-03-30T01:30:00",
                "2025-10-25T23:30:00", "2025-10-26T02:30:00", "2025-07-01T10:00:00", "2025-01-15T11:00:00"]


def test_naive_local_times_across_both_dst_transitions(sensor, berlin_csv):
    sensor.backfill(source=str(berlin_csv), map={"ts": "timestamp", "device_id": "tag", "value": "val"},
                    tz="Europe/Berlin").wait()
    rows = sensor.to_arrow().sort_by("value")
    got = [t.strftime("%Y-%m-%dT%H:%M:%S") for t in rows.column("ts").to_pylist()]
    assert got == UTC_EXPECTED


@pytest.mark.parametrize("policy, expected", [
    ("earliest", "2025-10-26T00:30:00"),  # first 02:30 (CEST, +02:00)
    ("latest", "2025-10-26T01:30:00"),    # second 02:30 (CET, +01:00)
])
def test_ambiguous_hour_follows_policy(sensor, tmp_path, policy, expected):
    path = tmp_path / "ambiguous.csv"
    pacsv.write_csv(pa.table({"ts": ["2025-10-26 02:30:00"], "device_id": ["a"], "value": ["1"]}), path)
    report = sensor.backfill(source=str(path), tz="Europe/Berlin", dst_policy=policy).wait().report()
    assert report["rows_written"] == 1
    assert sensor.to_arrow().column("ts")[0].as_py().strftime("%Y-%m-%dT%H:%M:%S") == expected


def test_drop_policy_counts_rejected_rows_in_the_balance(sensor, tmp_path):
    path = tmp_path / "mixed.csv"
    pacsv.write_csv(pa.table({"ts": ["2025-10-26 02:30:00", "2025-03-30 02:30:00", "2025-05-01 00:00:00"],
                              "device_id": ["a", "a", "a"], "value": ["1", "2", "3"]}), path)
    report = sensor.backfill(source=str(path), tz="Europe/Berlin", dst_policy="drop").wait().report()
    assert report["rows_rejected"]["reasons"] == {"dst_ambiguous": 1, "dst_nonexistent": 1}
    assert report["rows_written"] == 1
    balance = next(c for c in report["checks"] if c["name"] == "row_count_balance")
    assert balance["passed"] and "rejected 2" in balance["detail"]


def test_epoch_integers_need_and_use_a_unit(sensor, tmp_path):
    epoch = pa.table({"ts": [1_750_000_000, 1_750_000_060], "device_id": ["a", "b"], "value": [1.0, 2.0]})
    with pytest.raises(ValueError, match="time_unit"):
        sensor.backfill(source=epoch).wait()
    sensor.backfill(source=epoch, time_unit="s").wait()
    assert sensor.to_arrow().column("ts").to_pylist()[0] == datetime(2025, 6, 15, 15, 6, 40, tzinfo=UTC)


def test_older_rows_land_in_coarser_partitions(lake):
    table = lake.create_table("iot.tiered", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by={"P30D": "day", "P1Y": "month", None: "year"}, retention="P5Y")
    now = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    recent = make_readings(now - timedelta(days=5), days=2, devices=2, step_minutes=120)
    months_old = make_readings(now - timedelta(days=150), days=40, devices=2, step_minutes=240)
    years_old = make_readings(now - timedelta(days=3 * 365), days=30, devices=2, step_minutes=480)
    source = pa.concat_tables([recent, months_old, years_old])
    report = table.backfill(source=source).wait().report()
    assert report["phase"] == "published" and all(c["passed"] for c in report["checks"])
    assert sort_rows(table.to_arrow()).equals(sort_rows(source))
    iceberg = table.refresh().iceberg
    specs = {t.transform: t.spec_id for t in table.contract.tiers}
    files = iceberg.inspect.files()
    by_spec = {}
    for spec_id, path in zip(files.column("spec_id").to_pylist(), files.column("file_path").to_pylist(), strict=True):
        by_spec.setdefault(spec_id, []).append(path)
    assert set(by_spec) == set(specs.values())
    assert all("ts_year=" in p for p in by_spec[specs["year"]])
    assert all("ts_month=" in p for p in by_spec[specs["month"]])
    assert len(by_spec[specs["day"]]) == 2  # 2 days of recent data
    assert len(by_spec[specs["month"]]) <= 3  # 40 days span at most 3 months
    assert len(by_spec[specs["year"]]) <= 2
    # scans prune by partition under every spec and still return exactly the rows in range
    lo, hi = now - timedelta(days=140), now - timedelta(days=120)
    assert table.to_arrow(start=lo, end=hi).num_rows == sum(
        1 for t in source.column("ts").to_pylist() if lo <= t < hi)
    # the live path still writes day partitions (the default spec is the youngest tier)
    table.append(make_readings(now - timedelta(hours=3), days=0.1, devices=1, step_minutes=60))
    assert iceberg.refresh().spec().spec_id == specs["day"]
