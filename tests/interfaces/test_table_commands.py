"""Creating a table and declaring its cadence from the CLI, as a new user's first commands do."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.csv as pacsv

import timelake
from tests.conftest import cli, make_readings, recent


def test_create_from_a_schema_then_declare_the_cadence_that_coverage_measures(warehouse):
    created = cli("table", "create", "iot.sensor", "--schema", "ts timestamptz, device_id string, value double",
                  "--series", "device_id", "--partition-by", "P90D:day,month", "--retention", "P3Y", "--json",
                  warehouse=warehouse)
    assert json.loads(created.stdout)["partition_tiers"] == [{"max_age": "P90D", "transform": "day"},
                                                             {"max_age": None, "transform": "month"}]
    table = timelake.connect(warehouse=warehouse).table("iot.sensor")
    assert (table.contract.time_column, table.contract.series_key, table.contract.retention) == ("ts", ("device_id",), "P3Y")
    day = datetime.fromisoformat(recent(5)).replace(tzinfo=UTC)
    table.append(make_readings(day, days=2 / 24, devices=3, step_minutes=1))  # two hours of one day
    status = lambda: {b["bucket"]: b["status"] for b in json.loads(  # noqa: E731
        cli("coverage", "iot.sensor", "--start", recent(5), "--end", recent(4), "--json", warehouse=warehouse).stdout)["buckets"]}
    assert status() == {recent(5): "has_data"}, "without a cadence rows are all a day can show"
    shown = json.loads(cli("table", "show", "iot.sensor", "--json", warehouse=warehouse).stdout)
    assert (shown["expected_interval"], shown["expected_series"]) == (None, None)
    assert "expected_interval: not declared" in cli("table", "show", "iot.sensor", warehouse=warehouse).stdout
    cli("table", "set", "iot.sensor", "--expected-interval", "PT1M", warehouse=warehouse)
    assert status() == {recent(5): "has_data"}, "a cadence without a series count still cannot tell"
    cli("table", "set", "iot.sensor", "--expected-series", "3", warehouse=warehouse)
    assert status() == {recent(5): "partial"}
    shown = json.loads(cli("table", "show", "iot.sensor", "--json", warehouse=warehouse).stdout)
    assert (shown["expected_interval"], shown["expected_series"]) == ("PT1M", 3)


def test_create_like_a_sample_file_takes_its_columns_with_times_in_utc(warehouse, tmp_path):
    sample = tmp_path / "sample.csv"
    pacsv.write_csv(pa.table({"timestamp": ["2026-01-01 00:00:00"], "tag": ["a"], "val": [1.5]}), sample)
    cli("table", "create", "plant.tags", "--like", str(sample), "--series", "tag", "--expected-interval", "PT10S",
        "--expected-series", "4", warehouse=warehouse)
    table = timelake.connect(warehouse=warehouse).table("plant.tags")
    schema = table.iceberg.schema().as_arrow()
    assert schema.names == ["timestamp", "tag", "val"] and schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert table.iceberg.properties["timelake.expected-interval"] == "PT10S"
    assert table.iceberg.properties["timelake.expected-series"] == "4"


def test_table_create_and_set_refuse_bad_input_in_one_line(warehouse, tmp_path):
    cases = [
        (["table", "create", "iot.a", "--series", "device_id"], "--schema 'NAME TYPE, …' or --like FILE"),
        (["table", "create", "iot.a", "--schema", "ts timestamptz, a timestamptz"], "name the time column with --time"),
        (["table", "create", "iot.a", "--schema", "ts timestamptz", "--expected-interval", "P1M"], "fixed duration"),
        (["table", "set", "iot.missing", "--expected-interval", "PT1M"], "does not exist"),
        (["table", "create", "iot.a", "--like", str(tmp_path / "nope.csv")], "nope.csv"),
    ]
    for args, message in cases:
        result = cli(*args, warehouse=warehouse, check=False)
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert ("iot",) not in timelake.connect(warehouse=warehouse).catalog.list_namespaces()


def test_show_says_how_the_files_are_written_and_names_a_bad_parquet_property(warehouse):
    cli("table", "create", "iot.sensor", "--schema", "ts timestamptz, device_id string, value double", "--series", "device_id",
        warehouse=warehouse)
    parquet = json.loads(cli("table", "show", "iot.sensor", "--json", warehouse=warehouse).stdout)["parquet"]
    assert (parquet["codec"], parquet["page_rows"], parquet["dictionary_bytes"], parquet["blooms"]) == ("zstd", 20_000, 2 << 20, [])
    table = timelake.connect(warehouse=warehouse).table("iot.sensor")
    with table.iceberg.transaction() as tx:
        tx.set_properties({"write.parquet.page-row-limit": "5000", "write.parquet.bloom-filter-enabled.column.device_id": "true"})
    parquet = json.loads(cli("table", "show", "iot.sensor", "--json", warehouse=warehouse).stdout)["parquet"]
    assert parquet["page_rows"] == 5000 and parquet["blooms"] == [{"column": "device_id", "fpp": 0.01, "ndv": None}]
    assert "parquet: " in cli("table", "show", "iot.sensor", warehouse=warehouse).stdout
    with table.iceberg.refresh().transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "lzo"})
    result = cli("table", "show", "iot.sensor", warehouse=warehouse, check=False)
    assert result.returncode == 1 and "write.parquet.compression-codec='lzo'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
