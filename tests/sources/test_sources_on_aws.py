"""The new sources through the deployed workflow: moto's Step Functions running the real handlers."""

from __future__ import annotations

import gzip

import boto3

from tests.aws_fixtures import aws, moto_server  # noqa: F401
from tests.cloud.conftest import BUCKET, Cloud, cloud  # noqa: F401
from tests.conftest import SCHEMA as SENSOR_SCHEMA
from tests.conftest import sort_rows
from tests.sources.test_iceberg_source import MAP, _fill, _reference
from tests.sources.test_influx import EXPORT_HEADER, ORDER, SCHEMA, _points


def test_influx_export_on_s3_through_the_workflow(cloud: Cloud):  # noqa: F811
    expected, _, export = _points()
    body = gzip.compress((EXPORT_HEADER + "\n".join(export) + "\n").encode())
    boto3.client("s3").put_object(Bucket=BUCKET, Key="influx/hist.lp.gz", Body=body)
    table = cloud.lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                                    partition_by="day", retention="P3Y")
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/influx/hist.lp.gz", "map": {"ts": "time"}}
    result = cloud.run(job, "bf-influx-aws")
    assert result["status"] == "SUCCEEDED", result
    assert cloud.lake.job("bf-influx-aws").report()["rows_written"] == expected.num_rows
    assert table.to_arrow().cast(SCHEMA).sort_by(ORDER).equals(expected)


def test_iceberg_table_of_the_same_glue_catalog_through_the_workflow(cloud: Cloud, monkeypatch):  # noqa: F811
    for key, value in cloud.config.catalog_props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__HIST__{key.upper().replace('.', '__').replace('-', '_')}", value)
    source_table, _ = _fill(cloud.lake.catalog)
    table = cloud.lake.create_table("iot.sensor", schema=SENSOR_SCHEMA, time_column="ts", series_key=["device_id"],
                                    partition_by="day", retention="P3Y")
    result = cloud.run({"table": "iot.sensor", "source": "iceberg://hist/raw.readings", "map": MAP}, "bf-ice-aws")
    assert result["status"] == "SUCCEEDED", result
    source = source_table.scan().to_arrow()  # noqa: F841 (read by DuckDB by name)
    assert sort_rows(table.to_arrow()).equals(_reference(source))
