"""The engine's files go where the table's location provider puts data files, as Iceberg Java's writers and
pyiceberg's do: under ``write.data.path`` when it is set, under hashed directories with
``write.object-storage.enabled``. A merge, a replace and an abort find them there. (Against Spark's files under
the same properties: `tests/lake/test_data_locations.py`.)"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SCHEMA, after_replace, recent, reference_merge, sort_rows, stage_job
from timelake.model.iceberg_private import object_store_hash, with_metadata
from timelake.model.layout import data_location
from timelake.ports.store import UnitRecord
from timelake.steps.write import unit_path

HASHED = re.compile(r"/data/[01]{4}/[01]{4}/[01]{4}/[01]{8}/ts_day=\d{4}-\d{2}-\d{2}/bf-[^/]+\.parquet$")


def placed(lake, properties: dict[str, str]):
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y", target_file_size="64MB")
    with table.iceberg.transaction() as tx:
        tx.set_properties(properties)
    return table.refresh()


def data_files(table) -> list[str]:
    return [task.file.file_path for task in table.iceberg.refresh().scan().plan_files()]


def test_files_go_under_the_tables_data_path_and_an_abort_finds_them_there(lake, readings, tmp_path):
    elsewhere = tmp_path / "data-bucket"
    table = placed(lake, {"write.data.path": str(elsewhere)})
    first = readings(recent(10), days=2, devices=3, step_minutes=30, seed=1)
    table.backfill(source=first).wait()
    more = readings(recent(10), days=2, devices=4, step_minutes=30, seed=2)
    table.backfill(source=more, mode="merge").wait()
    fresh = readings(recent(9), days=1, devices=2, step_minutes=60, seed=3)
    table.backfill(source=fresh, mode="replace", start=recent(9), end=recent(8)).wait()
    assert sort_rows(table.to_arrow()).equals(after_replace(reference_merge(first, more), fresh, recent(9), recent(8)))
    files = data_files(table)
    assert files and all(f.removeprefix("file://").startswith(f"{elsewhere}/ts_day=") for f in files)
    assert not list(Path(table.iceberg.location().removeprefix("file://"), "data").rglob("*.parquet"))

    job_id = stage_job(lake, readings(recent(5), days=2, devices=2))
    staged = [Path(u.result["path"].removeprefix("file://")) for u in lake.runtime.store.units(job_id)]
    assert len(staged) == 2 and all(p.is_relative_to(elsewhere) and p.exists() for p in staged)
    assert lake.job(job_id).abort()["files_deleted"] == 2
    assert not any(p.exists() for p in staged)


def test_object_storage_layout_hashes_the_files_directories_the_same_on_every_write(lake, readings):
    table = placed(lake, {"write.object-storage.enabled": "true"})
    source = readings(recent(10), days=3, devices=3, step_minutes=30)
    table.backfill(source=source).wait()
    files = data_files(table)
    assert len(files) == 3 and all(HASHED.search(f) for f in files)
    assert len({f.split("/data/")[1][:23] for f in files}) == 3  # three days, three hashed directories
    assert sort_rows(table.to_arrow()).equals(sort_rows(source))
    unit = UnitRecord(unit_id="day-20000-s0-0of1", info={"spec_id": 0, "value": 20000})
    assert unit_path(table.iceberg, "bf-x", unit) == unit_path(table.iceberg, "bf-x", unit)  # a unit written again: one path
    assert unit_path(table.iceberg, "bf-x", unit) != unit_path(table.iceberg, "bf-y", unit)


def test_the_layouts_of_iceberg_javas_location_providers(lake, tmp_path):
    table = placed(lake, {})
    location = table.iceberg.location().rstrip("/")

    def where(**props: str) -> str:
        named = {"data": "write.data.path", "folder": "write.folder-storage.path", "hashed": "write.object-storage.enabled",
                 "store": "write.object-storage.path", "partitioned": "write.object-storage.partitioned-paths"}
        properties = {named[k]: v for k, v in props.items()}
        return data_location(with_metadata(table.iceberg, properties=properties), "ts_day=2026-01-02", "f.parquet")

    file = "ts_day=2026-01-02/f.parquet"
    assert where() == f"{location}/data/{file}"
    assert where(data="s3://b/d/") == f"s3://b/d/{file}"
    assert where(folder="s3://b/old") == f"s3://b/old/{file}"
    hashed = object_store_hash(file)
    assert re.fullmatch(r"[01]{4}/[01]{4}/[01]{4}/[01]{8}", hashed)
    assert where(hashed="true") == f"{location}/data/{hashed}/{file}"
    assert where(hashed="true", store="s3://b/os") == f"s3://b/os/{hashed}/iot/sensor/{file}"  # outside: namespace, name
    assert where(hashed="true", partitioned="false") == f"{location}/data/{object_store_hash('f.parquet')}-f.parquet"
