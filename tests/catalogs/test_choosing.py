"""How a catalog is chosen, by name, in each interface: the Python API (`timelake.connect(catalog=...)`,
TIMELAKE_CATALOG), the job JSON's ``catalog`` field, the DuckDB ``CALL`` and the CLI; a job stays on
the catalog it was started on; a catalog that cannot run a backfill is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import duckdb
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog

import timelake
import timelake.duckdb
from tests.catalogs.conftest import NamedCatalog, cli_json, define_in_yaml
from tests.conftest import cli_main
from tests.conftest import SCHEMA, make_readings, recent, sort_rows
from timelake.errors import CatalogUnsupported
from timelake.model.spec import JobSpec

TABLE = "iot.sensor"


def create_sensor(lake: timelake.Lake) -> timelake.Table:
    return lake.create_table(TABLE, schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day")


def test_connect_by_name_by_properties_and_by_environment(sqlite_catalog: NamedCatalog, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rows = make_readings(recent(10), days=2)
    lake = timelake.connect(sqlite_catalog.warehouse, catalog="lite")
    job = create_sensor(lake).backfill(rows, wait=True)
    assert job.record().spec["catalog"] == "lite"  # the record names the catalog: a resume finds the table again
    assert sort_rows(load_catalog("lite", **sqlite_catalog.props).load_table(TABLE).scan().to_arrow()).equals(sort_rows(rows))

    # the same catalog by its properties alone (pyiceberg's load_catalog(name, **props)), with no configuration
    # file (a SQL catalog's rows are keyed by its name: the name stays)
    for variable in ("PYICEBERG_HOME", "HOME"):  # pyiceberg looks in both
        monkeypatch.setenv(variable, str(tmp_path / "empty"))
    with pytest.raises(CatalogUnsupported, match="catalog 'lite' is not configured"):
        timelake.connect(tmp_path / "other", catalog="lite")
    same = timelake.connect(tmp_path / "other", catalog="lite", properties=sqlite_catalog.props)
    assert same.table(TABLE).to_arrow().num_rows == rows.num_rows

    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path / "pyiceberg-home"))
    monkeypatch.setenv("TIMELAKE_CATALOG", "lite")
    assert timelake.connect(sqlite_catalog.warehouse).job(job.id).record().phase == "published"


def test_a_job_stays_on_its_catalog(sqlite_catalog: NamedCatalog, pyiceberg_home: Path, tmp_path: Path) -> None:
    define_in_yaml(pyiceberg_home, "other", {"type": "sql", "uri": f"sqlite:///{tmp_path}/other.db",
                                              "warehouse": f"file://{tmp_path}/other"})
    lake = timelake.connect(sqlite_catalog.warehouse, catalog="lite")
    job = create_sensor(lake).backfill(make_readings(recent(10)), canary=True, wait=True)
    where = ("--warehouse", str(sqlite_catalog.warehouse))
    code, _, err = cli_main("backfill", "continue", job.id, "--catalog", "other", *where)
    assert code == 1 and err == (f"error: job {job.id} was started on catalog 'lite', not on catalog 'other': "
                                 "use --catalog lite (TIMELAKE_CATALOG, timelake.connect(catalog=...))\n")
    code, _, err = cli_main("backfill", "abort", job.id, *where, "--catalog", "other")
    assert code == 1 and err.count("\n") == 1
    with pytest.raises(CatalogUnsupported, match="started on catalog 'lite', not on the embedded lake"):
        timelake.connect(sqlite_catalog.warehouse).job(job.id)
    with pytest.raises(CatalogUnsupported, match="the job is for catalog 'other', but this runs on catalog 'lite'"):
        lake.create_job(JobSpec(table=TABLE, source="x.parquet", catalog="other"))
    assert cli_json("backfill", "abort", job.id, *where)["phase"] == "aborted"  # its own catalog, from its record


def test_the_job_json_names_the_catalog(sqlite_catalog: NamedCatalog, tmp_path: Path) -> None:
    create_sensor(timelake.connect(sqlite_catalog.warehouse, catalog="lite"))
    rows = make_readings(recent(12), days=1)
    pq.write_table(rows, tmp_path / "day.parquet")
    (tmp_path / "job.json").write_text(json.dumps({"table": TABLE, "source": str(tmp_path / "day.parquet"), "catalog": "lite"}))
    report = cli_json("backfill", TABLE, "--job", str(tmp_path / "job.json"), "--warehouse", str(sqlite_catalog.warehouse))
    assert report["phase"] == "published" and report["rows_written"] == rows.num_rows
    listed = cli_json("backfill", "list", "--warehouse", str(sqlite_catalog.warehouse))
    assert [(row["job_id"], row["catalog"]) for row in listed] == [(report["job_id"], "lite")]


def test_duckdb_call_names_the_catalog(sqlite_catalog: NamedCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    create_sensor(timelake.connect(sqlite_catalog.warehouse, catalog="lite"))
    monkeypatch.setenv("TIMELAKE_WAREHOUSE", str(sqlite_catalog.warehouse))
    con = duckdb.connect()
    timelake.duckdb.register(con)
    rows = make_readings(recent(15), days=1)  # noqa: F841 (read by DuckDB's replacement scan below)
    con.execute("CREATE TABLE history AS SELECT * FROM rows")
    [(phase, written)] = con.execute("SELECT phase, rows_written FROM timelake_backfill('iot.sensor', 'SELECT * FROM "
                                     "history', \"catalog\" := 'lite')").fetchall()
    assert (phase, written) == ("published", 24 * 3)
    assert load_catalog("lite", **sqlite_catalog.props).load_table(TABLE).scan().to_arrow().num_rows == 24 * 3
    with pytest.raises(duckdb.Error, match="catalog 'elsewhere' is not configured"):
        con.execute("SELECT * FROM timelake_backfill('iot.sensor', 'SELECT * FROM history', \"catalog\" := 'elsewhere')")


def test_a_catalog_that_cannot_commit_is_refused_in_one_line(pyiceberg_home: Path, aws: str, tmp_path: Path) -> None:  # noqa: F811
    """pyiceberg's DynamoDB catalog creates and reads tables but cannot commit to one: a dry run works
    (it commits nothing), a backfill is refused before any work, in one line."""
    boto3.client("s3").create_bucket(Bucket="lake")
    define_in_yaml(pyiceberg_home, "ddb", {"type": "dynamodb", "table-name": "iceberg", "dynamodb.endpoint": aws,
                                          "dynamodb.region": "us-east-1", "warehouse": "s3://lake/warehouse",
                                          "s3.endpoint": aws, "s3.region": "us-east-1"})
    where = ("--catalog", "ddb", "--warehouse", str(tmp_path / "lake"))
    cli_json("table", "create", TABLE, "--schema", "ts timestamptz, device_id string, value double", "--series", "device_id",
             "--partition-by", "day", *where)
    pq.write_table(make_readings(recent(10)), tmp_path / "day.parquet")
    assert cli_json("backfill", TABLE, "--from", str(tmp_path / "day.parquet"), "--dry-run", *where)["phase"] == "dry_run_complete"
    code, _, err = cli_main("backfill", TABLE, "--from", str(tmp_path / "day.parquet"), *where)
    assert code == 1 and err == ("error: catalog 'ddb' (dynamodb) cannot run a backfill: pyiceberg's DynamoDB catalog cannot "
                                 "commit to a table (commit_table is not implemented); use a sql, rest, glue or hive catalog\n")
