"""Every kind of catalog runs a backfill, a canary and an abort through the CLI, chosen by name with
``--catalog``: pyiceberg's SQL catalog on SQLite and on PostgreSQL, Glue on moto, and a REST catalog
served by Iceberg's own server side (Java) over JDBC catalogs. The outcome is read back through plain
pyiceberg (its own FileIO, not the engine's) and compared with an independent DuckDB merge; the branch
a job stages on, the files it wrote and its lease are checked in the catalog itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table as IcebergTable

import timelake
from tests.catalogs.conftest import NamedCatalog, cli_json
from tests.conftest import cli_main
from tests.conftest import make_readings, recent, reference_merge, sort_rows
from timelake.adapters.objects import filesystem
from timelake.model.report import AWAITING

TABLE = "iot.sensor"
COLUMNS = "ts timestamptz, device_id string, value double"


def plain_table(cat: NamedCatalog, table: str = TABLE) -> IcebergTable:
    """The table through pyiceberg alone: its own catalog object and FileIO, none of the engine's."""
    return load_catalog(cat.name, **cat.props).load_table(table)


def written_by(table: IcebergTable, job_id: str) -> list[str]:
    """Files under the table's location whose name carries the job id (the engine's unit files)."""
    fs, root = filesystem(table.location(), table.io)
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return [info.path for info in found if info.type == pafs.FileType.File and job_id in info.path.rsplit("/", 1)[-1]]


def source_file(tmp_path: Path, name: str, rows: pa.Table) -> str:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(rows, path)
    return str(path)


def backfill_canary_abort(cat: NamedCatalog, tmp_path: Path) -> dict[str, Any]:
    """The three things every catalog must carry, through the CLI; the later commands name no catalog:
    the job's record does. Returns what the kind-specific checks need."""
    where = ("--warehouse", str(cat.warehouse))
    cli_json("table", "create", TABLE, "--schema", COLUMNS, "--series", "device_id", "--catalog", cat.name, *where)
    live = make_readings(recent(20), days=2, devices=3)
    timelake.connect(cat.warehouse, catalog=cat.name).table(TABLE).append(live, evaluate_rules=False)

    history = make_readings(recent(24), days=6, devices=3, seed=1)  # overlaps the live days: existing rows win
    report = cli_json("backfill", TABLE, "--from", source_file(tmp_path, "history", history), "--catalog", cat.name, *where)
    assert report["phase"] == "published", report
    expected = reference_merge(live, history)
    assert sort_rows(plain_table(cat).scan().to_arrow()).equals(expected)
    assert report["rows_conflicting_existing"] == 2 * 24 * 3  # the two live days, 3 devices, hourly

    before = plain_table(cat).current_snapshot().snapshot_id
    canary_rows = make_readings(recent(40), days=3, devices=3, seed=2)
    started = cli_json("backfill", TABLE, "--from", source_file(tmp_path, "canary", canary_rows), "--canary",
                       "--catalog", cat.name, *where)
    job = started["job_id"]
    assert started["phase"] == AWAITING, started
    staged = plain_table(cat)
    assert f"backfill/{job}" in staged.metadata.refs and staged.current_snapshot().snapshot_id == before
    published = cli_json("backfill", "continue", job, *where)
    assert published["phase"] == "published", published
    expected = reference_merge(expected, canary_rows)
    after = plain_table(cat)
    assert sort_rows(after.scan().to_arrow()).equals(expected)
    assert list(after.metadata.refs) == ["main"]

    doomed = make_readings(recent(60), days=2, devices=3, seed=3)
    started = cli_json("backfill", TABLE, "--from", source_file(tmp_path, "doomed", doomed), "--canary",
                       "--catalog", cat.name, *where)
    job = started["job_id"]
    table = plain_table(cat)
    assert f"backfill/{job}" in table.metadata.refs and written_by(table, job)
    aborted = cli_json("backfill", "abort", job, *where)
    assert aborted["phase"] == "aborted" and aborted["files_deleted"] > 0
    table = plain_table(cat)
    assert list(table.metadata.refs) == ["main"] and table.current_snapshot().snapshot_id == after.current_snapshot().snapshot_id
    assert written_by(table, job) == []
    assert sort_rows(table.scan().to_arrow()).equals(expected)
    assert timelake.connect(cat.warehouse, catalog=cat.name).leases(TABLE) == []
    return {"expected": expected, "snapshot_id": table.current_snapshot().snapshot_id}


def test_sql_catalog_on_sqlite_from_pyiceberg_yaml(sqlite_catalog: NamedCatalog, tmp_path: Path) -> None:
    backfill_canary_abort(sqlite_catalog, tmp_path)
    assert not (sqlite_catalog.warehouse / "catalog.db").exists()  # the embedded lake's catalog was never made


def test_sql_catalog_on_postgresql_is_the_java_jdbc_catalogs(pg_catalog: NamedCatalog, rest_server, tmp_path: Path) -> None:
    """The PostgreSQL catalog's tables are Iceberg's JDBC catalog tables: Java's JdbcCatalog (behind the
    REST server, on the same database, under the same catalog name) loads the very table state."""
    outcome = backfill_canary_abort(pg_catalog, tmp_path)
    java = load_catalog("java", **rest_server.catalog_props(pg_catalog.name)).load_table(TABLE)
    assert java.current_snapshot().snapshot_id == outcome["snapshot_id"]
    assert sort_rows(java.scan().to_arrow()).equals(outcome["expected"])


def test_glue_catalog_on_moto(glue_catalog: NamedCatalog, tmp_path: Path) -> None:
    backfill_canary_abort(glue_catalog, tmp_path)
    assert plain_table(glue_catalog).location().startswith("s3://lake/warehouse/")


def test_rest_catalog_served_by_icebergs_own_handlers(rest_catalog: NamedCatalog, tmp_path: Path) -> None:
    outcome = backfill_canary_abort(rest_catalog, tmp_path)
    # behind the REST protocol, Java's JDBC catalog holds the table: pyiceberg's SQL catalog on its database sees it too
    sql = load_catalog(rest_catalog.extra["server_catalog"], type="sql", uri=rest_catalog.extra["sql_uri"])
    assert sql.load_table(TABLE).current_snapshot().snapshot_id == outcome["snapshot_id"]


@pytest.mark.parametrize("command", [("backfill", "history", TABLE), ("backfill", "leases", TABLE), ("table", "show", TABLE),
                                     ("coverage", TABLE)])
def test_an_unknown_catalog_is_one_line(command: tuple[str, ...], pyiceberg_home: Path, tmp_path: Path) -> None:
    code, _, err = cli_main(*command, "--catalog", "nowhere", "--warehouse", str(tmp_path / "lake"))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: catalog 'nowhere' is not configured") and "PYICEBERG_CATALOG__NOWHERE__TYPE" in err
