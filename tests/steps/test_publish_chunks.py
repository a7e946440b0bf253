"""``publish_by`` costs the periods that hold data, not every calendar period of the range."""

from __future__ import annotations

import pyarrow as pa

from tests.conftest import SCHEMA, sort_rows

DAYS = ["1971-03-04", "1988-07-01", "1999-12-31", "2013-05-20", "2025-11-30"]


def _table(lake):
    return lake.create_table("iot.decades", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                             partition_by="day")


def test_a_job_over_decades_by_day_publishes_one_chunk_per_day_with_data(lake, readings):
    table = _table(lake)
    source = pa.concat_tables([readings(day, days=0.25, devices=2) for day in DAYS])
    job = table.backfill(source=source, start="1970-01-01", end="2026-06-01", publish_by="day").wait()
    report = job.report()
    assert report["phase"] == "published"
    assert len(report["published_snapshot_ids"]) == len(DAYS)  # one commit per day with rows
    assert len(report["published_chunks"]) <= 2 * len(DAYS) + 1  # those days and the empty stretches between them
    assert sort_rows(table.to_arrow()).equals(sort_rows(source))


def test_replace_over_decades_by_day_also_cuts_the_days_main_held(lake, readings):
    table = _table(lake)
    old = pa.concat_tables([readings(day, days=0.25, devices=2, seed=1) for day in ("1975-01-01", "2001-09-09")])
    table.append(old)
    source = pa.concat_tables([readings(day, days=0.25, devices=2) for day in DAYS])
    report = table.backfill(source=source, mode="replace", start="1970-01-01", end="2026-06-01",
                            publish_by="day").wait().report()
    assert report["phase"] == "published"
    assert len(report["published_snapshot_ids"]) == len(DAYS) + 2  # each day with rows, old or new, in its own commit
    assert len(report["published_chunks"]) <= 2 * (len(DAYS) + 2) + 1
    assert sort_rows(table.refresh().to_arrow()).equals(sort_rows(source))  # the old days were in the range: gone
