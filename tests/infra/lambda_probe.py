"""Run as ``python -I -S lambda_probe.py SETTINGS.json`` by tests/infra/test_lambda_size.py: one function
as Lambda would load it, with nothing on ``sys.path`` but its code folder, its layers (one
``python/`` folder, as Lambda merges them under /opt) and the packages of the Lambda Python runtime.

It imports the handler, then uses what each of the function's layers is there for through the
engine's own code (S3 through pyarrow, Glue through pyiceberg, the follow-up tables' swap, the file,
DuckDB and line-protocol sources, the PostgreSQL driver), and checks that what the function does not
get is really absent. Prints ``ok`` last. Standard library only at module level: nothing else is
importable before the paths are set.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ABSENT = {  # a module of each layer, which must not import without that layer
    "duckdb": "duckdb",
    "postgres": "adbc_driver_postgresql",
}
NEVER = ("pyiceberg_core", "sqlalchemy", "pandas", "fsspec")  # in no layer (`infra.layer.DROPPED`)


class LambdaContext:
    function_name = "probe"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:probe"
    memory_limit_in_mb = 512
    aws_request_id = "probe"
    log_group_name = "/aws/lambda/probe"
    log_stream_name = "probe"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def main(settings: dict[str, Any]) -> None:
    sys.path[:0] = [settings["code"], *settings["paths"]]
    assert not [p for p in sys.path if "site-packages" in p], sys.path
    spec = importlib.util.spec_from_file_location("app", Path(settings["code"]) / "app.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)  # module level: Powertools Logger/Tracer, the engine's imports
    for layer in settings["layers"]:
        CHECKS[layer](settings)
    if settings["function"] == "api":
        api(handler, settings)
    for layer, module in ABSENT.items():
        if layer not in settings["layers"]:
            refuse(module, f"without the {layer} layer")
    for module in NEVER:
        refuse(module, "although no layer ships it")
    print("ok")


def refuse(module: str, why: str) -> None:
    try:
        __import__(module)
    except ImportError:
        return
    raise AssertionError(f"{module} is importable {why}")


def engine(settings: dict[str, Any]) -> None:
    import zoneinfo

    import boto3
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    import pyroaring
    import zstandard
    from pyiceberg.catalog import load_catalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    from timelake.adapters.objects import filesystem
    from timelake.model.commit import swap
    from timelake.model.layout import fresh_schema, time_filter
    from timelake.sources.base import open_source

    for module in settings["lazy_imports"]:  # what handlers import inside functions
        __import__(module)
    zoneinfo.reset_tzpath([])  # time zones from the layer's tzdata, never this machine's /usr/share/zoneinfo
    assert datetime(2024, 7, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")).utcoffset() == timedelta(hours=2)
    assert zstandard.decompress(zstandard.compress(b"x" * 100)) == b"x" * 100 and len(pyroaring.BitMap([1, 2])) == 2

    start = int(datetime(2024, 3, 1, tzinfo=UTC).timestamp() * 1_000_000)
    rows = pa.table({"ts": pa.array(start + np.arange(96) * 1_800_000_000, pa.timestamp("us", tz="UTC")),
                     "device": pa.array(["a", "b"] * 48), "value": pa.array(np.arange(96, dtype=np.float64))})
    boto3.client("s3").create_bucket(Bucket="lake")
    fs, path = filesystem("s3://lake/source/part-0.parquet")  # pyarrow's own S3 client (libarrow_s3)
    pq.write_table(rows, path, filesystem=fs)
    with fs.open_output_stream("lake/source/part-1.csv") as out:
        pcsv.write_csv(rows, out)
    for uri in ("s3://lake/source/*.parquet", "s3://lake/source/*.csv"):  # what plan and scan open
        source = open_source(uri, batch_rows=40)
        read = pa.Table.from_batches([b.data for piece in source.pieces() for b in source.batches(piece)])
        assert read.num_rows == 96 and pc.sum(pc.cast(read.column("value"), pa.float64())).as_py() == 4560.0, uri

    endpoint = settings["endpoint"]
    catalog = load_catalog("glue", **{
        "type": "glue", "warehouse": "s3://lake/warehouse", "glue.endpoint": endpoint, "glue.region": "us-east-1",
        "s3.endpoint": endpoint, "s3.region": "us-east-1"})
    catalog.create_namespace("probe")
    schema = fresh_schema(rows.schema)
    table = catalog.create_table("probe.readings", schema=schema, partition_spec=PartitionSpec(
        PartitionField(schema.find_field("ts").field_id, 1000, DayTransform(), "ts_day")))
    swap(table, None, rows, "probe")  # as rollup writes its day-partitioned tables, and publish its coverage
    day_two = time_filter("ts", start + 86_400_000_000 + 3_600_000_000, start + 2 * 86_400_000_000)
    swap(table.refresh(), day_two, rows.slice(0, 1), "probe")  # drops 23 h of day 2, rewriting its file
    kept = catalog.load_table("probe.readings").scan().to_arrow()
    assert kept.num_rows == 96 - 46 + 1, kept.num_rows


def duckdb(settings: dict[str, Any]) -> None:
    import boto3
    import pyarrow as pa

    from timelake.sources.duckdb import DuckDBSource
    from timelake.sources.influx import open_influx_files

    source = DuckDBSource("duckdb:", "SELECT range AS i FROM range(100000)", 10_000)  # a --from-sql source
    assert sum(b.data.num_rows for b in source.batches()) == 100_000
    # An InfluxDB export writes each field of a point on its own line; scan merges them in DuckDB.
    lines = "".join(f"cpu,host=h{i % 3} usage={i}.5 {1_700_000_000 + i}\ncpu,host=h{i % 3} idle={i}i {1_700_000_000 + i}\n"
                    for i in range(300))
    boto3.client("s3").put_object(Bucket="lake", Key="influx/export.lp", Body=lines.encode())
    export = open_influx_files("s3://lake/influx/export.lp", "cpu", "s", 100)
    merged = pa.Table.from_batches([b.data for piece in export.pieces() for b in export.batches(piece)])
    assert merged.num_rows == 300 and merged.column("idle").null_count == 0, merged.schema


def postgres(settings: dict[str, Any]) -> None:
    from adbc_driver_postgresql import StatementOptions, dbapi

    assert StatementOptions.BATCH_SIZE_HINT_BYTES  # the source sets it on each statement
    with dbapi.connect(settings["postgres"]) as con, con.cursor() as cursor:
        cursor.execute("SELECT generate_series(1, 1000) AS i")
        assert cursor.fetch_arrow_table().num_rows == 1000


def api(handler: Any, settings: dict[str, Any]) -> None:
    """One request through Powertools' resolver, its OpenAPI validation and the DynamoDB job store."""
    import boto3

    from timelake.aws.store import table_definition

    boto3.client("dynamodb").create_table(TableName=settings["jobs_table"], **table_definition())
    path = "/backfills/bf-probe"
    response = handler.handler({
        "resource": "/backfills/{id}", "path": path, "httpMethod": "GET", "headers": {}, "multiValueHeaders": {},
        "queryStringParameters": None, "multiValueQueryStringParameters": None, "pathParameters": {"id": "bf-probe"},
        "stageVariables": None, "isBase64Encoded": False, "body": None,
        "requestContext": {"httpMethod": "GET", "path": path, "stage": "prod", "requestId": "r1",
                           "identity": {"userArn": "arn:aws:iam::123456789012:user/probe"}},
    }, LambdaContext())
    assert response["statusCode"] == 404 and "bf-probe" in json.loads(response["body"])["message"], response


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {"engine": engine, "duckdb": duckdb, "postgres": postgres}

if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
