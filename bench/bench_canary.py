"""What a canary costs: the same job run straight through and run as canary + continue, on the same rows.

Prints the time to the canary report (and how much of it is the report itself), the time of the
continue, and the ratio of canary + continue to the straight run. Not a test: nothing asserts on timings.

    .venv/bin/python bench/bench_canary.py                     # 50 devices x 20 days x 1 minute = 1.44M rows
    .venv/bin/python bench/bench_canary.py --devices 20 --days 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parents[1]))

import timelake  # noqa: E402
from tests.conftest import SCHEMA, make_readings  # noqa: E402
from timelake import canary  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--step-minutes", type=int, default=1)
    args = parser.parse_args()
    start = (datetime.now(UTC) - timedelta(days=args.days + 10)).strftime("%Y-%m-%d")
    with tempfile.TemporaryDirectory(prefix="bench-canary-") as tmp:
        source = Path(tmp, "src")
        source.mkdir()
        for day in range(args.days):
            first = (datetime.fromisoformat(start) + timedelta(days=day)).strftime("%Y-%m-%d")
            pq.write_table(make_readings(first, days=1, devices=args.devices, step_minutes=args.step_minutes, seed=day),
                           source / f"day-{day:03d}.parquet")
        rows = pq.ParquetDataset(str(source)).read().num_rows
        straight = _run(Path(tmp, "straight"), source, canary_day=None)
        with_canary = _run(Path(tmp, "canary"), source, canary_day=True)
    print(f"{rows:,} rows, {args.days} day(s), {args.devices} device(s)")
    print(f"straight run                 {straight['total']:7.2f} s")
    print(f"canary to awaiting-approval  {with_canary['canary']:7.2f} s  (canary report {with_canary['report']:.2f} s)")
    print(f"continue to published        {with_canary['continue']:7.2f} s")
    ratio = (with_canary["canary"] + with_canary["continue"]) / straight["total"]
    print(f"(canary + continue) / straight = {ratio:.2f}   canary / straight = {with_canary['canary'] / straight['total']:.2f}")


def _run(warehouse: Path, source: Path, canary_day: bool | None) -> dict[str, float]:
    lake = timelake.connect(warehouse=warehouse)
    table = lake.create_table("bench.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y", target_file_size="128MB")
    report_seconds = [0.0]
    build = canary.build

    def timed_build(*a, **k):  # the report's share of the canary step, timed from outside
        began = time.perf_counter()
        try:
            return build(*a, **k)
        finally:
            report_seconds[0] += time.perf_counter() - began

    canary.build = timed_build
    try:
        began = time.perf_counter()
        job = table.backfill(source=f"{source}/*.parquet", canary=canary_day, max_concurrency=2).wait()
        first = time.perf_counter() - began
        if not canary_day:
            return {"total": first}
        began = time.perf_counter()
        job.approve(wait=True)
        assert job.record().phase == "published", job.record().state.get("error")
        return {"canary": first, "report": report_seconds[0], "continue": time.perf_counter() - began}
    finally:
        canary.build = build


if __name__ == "__main__":
    main()
