"""Wide sources (one column per series) read as long rows, from a file, a DataFrame (Python API) and a
DuckDB `CALL`; and the wide reader's own errors, each one line naming the column."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import timelake
import timelake.duckdb
from timelake.errors import InvalidJob
from timelake.sources.base import SourceError, open_source
from timelake.sources.wide import OUTPUT_ROWS, WideSource

UTC = timezone.utc


def _sheet(rows: int = 6) -> pd.DataFrame:
    start = datetime(2026, 5, 1, tzinfo=UTC)
    return pd.DataFrame({"time": [start + timedelta(minutes=i) for i in range(rows)],
                         "batch": [f"B{i // 3}" for i in range(rows)],
                         "A/t1": [float(i) if i % 2 else None for i in range(rows)],
                         "A/t2": [10.0 + i for i in range(rows)], "B/t1": [100.0 + i for i in range(rows)]})


def _long(frame: pd.DataFrame) -> list[tuple]:
    """The long rows a wide sheet stands for, computed without the reader: blank cells left out."""
    melted = frame.melt(id_vars=["time", "batch"], var_name="key").dropna(subset=["value"])
    return sorted((t.to_pydatetime(), key.split("/")[0], key.split("/")[1], v, b)
                  for t, b, key, v in melted[["time", "batch", "key", "value"]].itertuples(index=False))


@pytest.fixture
def plant(lake: timelake.Lake) -> timelake.Table:
    schema = pa.schema([("ts", pa.timestamp("us", "UTC")), ("site", pa.string()), ("tag", pa.string()),
                        ("value", pa.float64()), ("batch_id", pa.string())])
    return lake.create_table("plant.wide", schema=schema, time_column="ts", series_key=["site", "tag"])


def _rows(table: timelake.Table) -> list[tuple]:
    return sorted((r["ts"], r["site"], r["tag"], r["value"], r["batch_id"]) for r in table.to_arrow().to_pylist())


def test_a_wide_dataframe_through_the_python_api(plant):
    frame = _sheet()
    report = plant.backfill(source=frame, wide=True, key_separator="/", id_columns=["batch"],
                            map={"ts": "time", "batch_id": "batch"}).wait().report()
    assert report["phase"] == "published" and report["rows_in_source"] == len(_long(frame))
    assert _rows(plant) == _long(frame)


def test_a_wide_query_through_duckdb_call(plant, lake):
    con = duckdb.connect()
    con.register("frame", _sheet())
    con.execute("CREATE TABLE sheet AS SELECT * FROM frame")  # the query runs on a cursor: a table it sees
    timelake.duckdb.register(con, lake)
    [(job_id, phase, rows_in, written, _)] = con.sql(
        "CALL timelake_backfill('plant.wide', 'SELECT * FROM sheet', wide := true, key_separator := '/', "
        "id_columns := ['batch'], \"map\" := {'ts': 'time', 'batch_id': 'batch'})").fetchall()
    assert phase == "published" and rows_in == written == len(_long(_sheet()))
    assert _rows(plant.refresh()) == _long(_sheet())


def test_a_batch_of_many_columns_is_cut_to_bounded_long_batches(tmp_path):
    tags = 700
    frame = pa.table({"t": [f"2026-05-01T00:{m:02d}:00Z" for m in range(60)] * 10,
                      **{f"tag{i}": [str(i)] * 600 for i in range(tags)}})
    path = tmp_path / "wide.csv"
    pacsv.write_csv(frame, path)
    wide = WideSource(open_source(str(path)), "t", [], ["tag"], "value")
    sizes = [b.data.num_rows for b in wide.batches()]
    assert sum(sizes) == 600 * tags and max(sizes) <= OUTPUT_ROWS
    first = next(wide.batches())
    assert first.where(5 * tags + 1) == f"line 7 of {path}, column 'tag1'"  # a line's cells one after another


def test_wide_errors_name_the_column(plant, tmp_path):
    path = tmp_path / "sheet.csv"
    path.write_text("time,A/t1,t2\n2026-05-01T00:00:00Z,1,2\n")
    with pytest.raises(SourceError, match=r"column 't2' of .*sheet.csv does not split at '/' into 2 parts \(site, tag\)"):
        plant.backfill(source=str(path), wide=True, key_separator="/", map={"ts": "time"}).wait()
    with pytest.raises(SourceError, match="give key_separator"):
        plant.backfill(source=str(path), wide=True, map={"ts": "time"}).wait()
    with pytest.raises(InvalidJob, match="drop value from the column map"):
        plant.backfill(source=str(path), wide=True, key_separator="/", map={"ts": "time", "value": "A/t1"}).wait()
    with pytest.raises(ValueError, match="add wide"):
        plant.backfill(source=str(path), key_separator="/")
    assert plant.to_arrow().num_rows == 0


def test_the_lines_tell_the_clock_change_for_a_series_blank_through_one_pass(lake, tmp_path):
    """Tag B logs nothing in the first pass through the repeated hour: its own rows cannot tell which
    pass they are in, the lines around them can."""
    table = lake.create_table("plant.cells", schema=pa.schema([("ts", pa.timestamp("us", "UTC")), ("tag", pa.string()),
                                                               ("value", pa.float64())]), time_column="ts", series_key=["tag"])
    path = tmp_path / "sheet.csv"
    path.write_text("t_stamp,A,B\n2026-11-01 00:30,1,\n2026-11-01 01:00,2,\n2026-11-01 01:30,3,\n"
                    "2026-11-01 01:00,4,40\n2026-11-01 01:30,5,50\n2026-11-01 02:00,6,60\n")
    report = table.backfill(source=str(path), wide=True, map={"ts": "t_stamp"}, tz="America/Chicago").wait().report()
    assert report["phase"] == "published"
    at = lambda h, m: datetime(2026, 11, 1, h, m, tzinfo=UTC)  # noqa: E731 (CDT is UTC-5 until 2:00, then CST UTC-6)
    assert sorted((r["tag"], r["ts"], r["value"]) for r in table.to_arrow().to_pylist()) == [
        ("A", at(5, 30), 1.0), ("A", at(6, 0), 2.0), ("A", at(6, 30), 3.0), ("A", at(7, 0), 4.0), ("A", at(7, 30), 5.0),
        ("A", at(8, 0), 6.0), ("B", at(7, 0), 40.0), ("B", at(7, 30), 50.0), ("B", at(8, 0), 60.0)]
