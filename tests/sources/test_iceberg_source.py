"""An existing Iceberg table as the source: a second SQL catalog and a Glue catalog on moto."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, MonthTransform
from pyiceberg.types import FloatType, NestedField, StringType, TimestamptzType

from tests.aws_fixtures import aws, moto_server  # noqa: F401
from tests.conftest import make_readings, recent, sort_rows
from tests.sources.conftest import assert_nothing_staged, cli, error_line, job_error
from timelake.model.spec import JobSpec
from timelake.steps.scan import open_job_source

SOURCE_SCHEMA = Schema(
    NestedField(1, "event_time", TimestamptzType(), required=True),
    NestedField(2, "sensor", StringType(), required=True),
    NestedField(3, "reading", FloatType()),
    NestedField(4, "note", StringType()),
)
DAY_SPEC = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=DayTransform(), name="event_day"))
MAP = {"ts": "event_time", "device_id": "sensor", "value": "reading"}


def _rows(day: int, days: float = 1, hour: int = 0) -> pa.Table:
    start = datetime.fromisoformat(recent(20 - day)).replace(tzinfo=UTC) + timedelta(hours=hour)
    rows = make_readings(start, days=days, devices=3, step_minutes=30, seed=day + hour)
    return pa.table({
        "event_time": rows["ts"], "sensor": rows["device_id"], "reading": rows["value"].cast(pa.float32()),
        "note": pa.array(["x"] * rows.num_rows),
    }, schema=SOURCE_SCHEMA.as_arrow())


def _fill(catalog: Catalog) -> tuple[object, int]:
    """Days 0 and 1 in one commit, more of day 1 and day 4 in a second: four files, day 1 holds two."""
    catalog.create_namespace_if_not_exists("raw")
    table = catalog.create_table("raw.readings", schema=SOURCE_SCHEMA, partition_spec=DAY_SPEC)
    table.append(pa.concat_tables([_rows(0), _rows(1, days=0.5)]))
    first = table.current_snapshot().snapshot_id
    table.append(pa.concat_tables([_rows(1, days=0.5, hour=12), _rows(4)]))
    return table, first


def _reference(source: pa.Table) -> pa.Table:
    """The mapping as SQL: rename, float -> double."""
    return sort_rows(duckdb.sql("SELECT event_time AS ts, sensor AS device_id, reading::DOUBLE AS value "
                                "FROM source").to_arrow_table())


@pytest.fixture
def sql_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, int]:
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/source-catalog.db", "warehouse": f"file://{tmp_path}/source"}
    for key, value in props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__SRC__{key.upper()}", value)
    return _fill(load_catalog("src", **props))


def _files_per_piece(spec: JobSpec) -> list[int]:
    src = open_job_source(spec)
    return [len(list(src.scan_for(piece).plan_files())) for piece in src.pieces()]


def test_sql_catalog_table_backfills_with_pruned_scans_per_piece(lake, sensor, sql_source):
    source_table, _ = sql_source
    spec = JobSpec(table="iot.sensor", source="iceberg://src/raw.readings", map=MAP)
    files = Counter(source_table.inspect.files()["partition"].combine_chunks().field("event_day").to_pylist())
    assert sorted(files.values()) == [1, 1, 2]
    assert _files_per_piece(spec) == [files[day] for day in sorted(files)]  # each piece plans only its partition

    report = lake.submit(spec, wait=True).wait().report()
    assert report["phase"] == "published"
    source = source_table.scan().to_arrow()  # noqa: F841 (read by DuckDB by name)
    assert sort_rows(sensor.to_arrow()).equals(_reference(source))
    assert report["ignored_source_columns"] == ["note"]


def test_a_snapshot_id_reads_that_snapshot(lake, sensor, sql_source):
    source_table, first = sql_source
    lake.submit(JobSpec(table="iot.sensor", source=f"iceberg://src/raw.readings@{first}", map=MAP), wait=True).wait()
    source = source_table.scan(snapshot_id=first).to_arrow()  # noqa: F841
    assert sort_rows(sensor.to_arrow()).equals(_reference(source))


def test_bad_iceberg_sources_are_one_clear_line_and_nothing_is_staged(lake, sensor, warehouse, sql_source):
    sensor.append(make_readings(recent(30), days=1))
    main = sensor.refresh().iceberg.current_snapshot().snapshot_id
    missing = error_line(cli("backfill", "iot.sensor", "--from", "iceberg://src/raw.nope", "--map",
                             "ts=event_time,device_id=sensor,value=reading", warehouse=warehouse))
    assert "source table 'raw.nope' does not exist in catalog 'src'" in missing
    cases = [
        ("iceberg://nocat/raw.readings", MAP, "catalog 'nocat' of source"),
        ("iceberg://src/raw.readings@12345", MAP, "source table 'raw.readings' has no snapshot '12345'"),
        ("iceberg://src/raw.readings", {"device_id": "sensor", "value": "reading"},
         "column 'ts' (source 'ts') is required but missing from the source"),
    ]
    for uri, mapping, message in cases:
        assert message in job_error(lake, table="iot.sensor", source=uri, map=mapping)
    assert_nothing_staged(lake, "iot.sensor", main)


def test_glue_catalog_table_on_moto(lake, sensor, aws, monkeypatch):  # noqa: F811
    boto3.client("s3").create_bucket(Bucket="history")
    props = {"type": "glue", "warehouse": "s3://history/wh", "glue.endpoint": aws, "glue.region": "us-east-1",
             "s3.endpoint": aws, "s3.region": "us-east-1", "s3.access-key-id": "testing",
             "s3.secret-access-key": "testing"}
    for key, value in props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__GLUESRC__{key.upper().replace('.', '__').replace('-', '_')}", value)
    source_table, _ = _fill(load_catalog("gluesrc", **props))
    spec = JobSpec(table="iot.sensor", source="iceberg://gluesrc/raw.readings", map=MAP)
    assert _files_per_piece(spec) == [1, 2, 1]
    lake.submit(spec, wait=True).wait()
    source = source_table.scan().to_arrow()  # noqa: F841
    assert sort_rows(sensor.to_arrow()).equals(_reference(source))


def test_partitions_of_two_specs_overlap_into_one_piece(lake, sensor, tmp_path, monkeypatch):
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/evolved.db", "warehouse": f"file://{tmp_path}/evolved"}
    for key, value in props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__EVO__{key.upper()}", value)
    catalog = load_catalog("evo", **props)
    catalog.create_namespace("raw")
    by_month = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=MonthTransform(), name="event_month"))
    table = catalog.create_table("raw.readings", schema=SOURCE_SCHEMA, partition_spec=by_month)
    table.append(pa.concat_tables([_rows(0), _rows(4)]))
    with table.update_spec() as update:  # newer data partitioned by day, as tables get re-partitioned
        update.remove_field("event_month")
        update.add_field("event_time", DayTransform(), "event_day")
    table.append(_rows(2))
    spec = JobSpec(table="iot.sensor", source="iceberg://evo/raw.readings", map=MAP)
    src = open_job_source(spec)
    months = {piece.split("/")[0][:7] for piece in src.pieces()}
    assert len(src.pieces()) == len(months)  # each month's range absorbs the day partitions inside it
    lake.submit(spec, wait=True).wait()
    source = table.scan().to_arrow()  # noqa: F841
    assert sort_rows(sensor.to_arrow()).equals(_reference(source))
