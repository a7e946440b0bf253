"""Replace on an age-tiered table keeps every file in the tier of its rows and adds one snapshot per
publish chunk: the partly covered month and year files are rewritten in their own spec, and the
deletes and adds are one overwrite snapshot (no DELETE-then-APPEND middle state to time-travel to)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tests.conftest import SCHEMA, make_readings, sort_rows
from tests.steps.java_expiry import assert_safe_for_other_engines
from timelake.model.contract import Contract


def _ancestors(table) -> list[int]:
    ids, snapshot = [], table.current_snapshot()
    while snapshot is not None:
        ids.append(snapshot.snapshot_id)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return ids


def _assert_files_in_their_tier(iceberg) -> None:
    contract = Contract.from_table(iceberg)
    cutoffs = contract.tier_cutoffs(datetime.now(UTC))
    for task in iceberg.scan().plan_files():
        rows = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["ts"])
        ts = pc.cast(rows.column("ts"), pa.int64()).to_numpy()
        tiers = {contract.tiers[i].spec_id for i in np.unique(contract.tier_index(ts, cutoffs))}
        assert tiers == {task.file.spec_id}, (task.file.file_path, tiers, task.file.spec_id)


def test_replace_keeps_tiers_and_commits_one_snapshot_per_chunk(lake):
    table = lake.create_table("iot.tiered", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by={"P90D": "day", "P2Y": "month", None: "year"}, retention="P5Y")
    now = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    years_old = now - timedelta(days=3 * 365)
    table.backfill(source=pa.concat_tables([
        make_readings(now - timedelta(days=20), days=5, devices=2, step_minutes=120),
        make_readings(now - timedelta(days=200), days=60, devices=2, step_minutes=240),
        make_readings(years_old, days=60, devices=2, step_minutes=480),
    ])).wait()
    jobs = [  # (start, end, publish_by): partly covered year, month and day partitions, then two month chunks
        (years_old + timedelta(days=10), years_old + timedelta(days=20), None),
        (now - timedelta(days=190), now - timedelta(days=185), None),
        (now - timedelta(days=18), now - timedelta(days=17), None),
        (now - timedelta(days=170), now - timedelta(days=150), "month"),
    ]
    for n, (start, end, publish_by) in enumerate(jobs):
        iceberg = table.refresh().iceberg
        before, snapshots_before = table.to_arrow(), len(_ancestors(iceberg))
        source = make_readings(start, days=(end - start).days, devices=2, step_minutes=240, seed=n, value_offset=1000)
        job = table.backfill(source=source, mode="replace", start=start, end=end, publish_by=publish_by).wait()
        report = job.report()
        ts = before.column("ts")
        inside = pc.and_(pc.greater_equal(ts, pa.scalar(start, SCHEMA.field("ts").type)),
                         pc.less(ts, pa.scalar(end, SCHEMA.field("ts").type)))
        expected = pa.concat_tables([before.filter(pc.invert(inside)).cast(SCHEMA), source])
        assert sort_rows(table.to_arrow()).equals(sort_rows(expected))
        iceberg = table.refresh().iceberg
        assert len(_ancestors(iceberg)) - snapshots_before == len(report["published_snapshot_ids"]) == (
            2 if publish_by else 1)
        assert all(iceberg.snapshot_by_id(i).summary.operation.value == "overwrite" for i in report["published_snapshot_ids"])
        assert report["rows_replaced"] == before.filter(inside).num_rows > 0
        _assert_files_in_their_tier(iceberg)
        assert_safe_for_other_engines(iceberg)
