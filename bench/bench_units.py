"""Units per partition benchmark: a dense day written as 1 unit and as 26, on the same rows.

Not a test: it prints times, bytes and ratios beside their targets and asserts nothing about speed.

    .venv/bin/python bench/bench_units.py             # one dense day: 20,000 devices at 1/min = 28.8M rows
    .venv/bin/python bench/bench_units.py --devices 2000 --days 3

The job's steps run one by one in this process: plan and scan once per case, then every unit's write
on one thread, timed alone. The 26-unit case's target file size is a day's bytes / 26, as the planner
estimates them (its scan sample's bytes a row), so the cut makes 26 units a day. The day is dense (28.8M rows, a 1-unit file of about 70 MB) so that each of the 26 units holds
about a million rows: on 2,000 devices a unit's file is 350 KB, and a unit's fixed costs (a Parquet
writer, the table's load, the unit's record: about 8 ms) are then as large as its rows' work. Targets: write seconds per row at 26 units / at 1 unit <= 1.2, and bytes
the writes read / bytes the scan spilled <= 1.1 in both cases.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers"))

import timelake  # noqa: E402
from timelake.model.spec import JobSpec  # noqa: E402
from timelake.steps.plan import cut, pending_pieces, plan, scan  # noqa: E402
from timelake.steps.scan import read_result  # noqa: E402
from timelake.steps.write import write_unit  # noqa: E402

SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])


def readings(devices: int, days: int) -> pa.Table:
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=days + 2)
    minutes = days * 24 * 60
    ts = np.tile(np.datetime64(start.replace(tzinfo=None), "us") + np.arange(minutes) * np.timedelta64(60, "s"), devices)
    dev = np.repeat(np.array([f"dev-{i:05d}" for i in range(devices)]), minutes)
    value = np.random.default_rng(1).normal(20, 5, devices * minutes).round(3)
    return pa.table({"ts": pa.array(ts).cast(SCHEMA.field("ts").type), "device_id": dev, "value": value}, schema=SCHEMA)


def run(source: pa.Table, days: int, target_file_size: str) -> dict[str, float]:
    """One case; its ``day_bytes`` are a day's file bytes as the planner estimates them (its scan sample)."""
    with tempfile.TemporaryDirectory() as warehouse:
        lake = timelake.connect(warehouse=warehouse)
        lake.create_table("bench.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                          partition_by="day", target_file_size=target_file_size)
        rt = lake.runtime
        job = lake.create_job(JobSpec(table="bench.sensor", source="<pyarrow.Table>"))
        plan(rt, job.id, source)
        tasks = pending_pieces(rt, job.id)
        for task in tasks:
            scan(rt, job.id, task, source)
        scanned = [read_result(rt, job.id, t) for t in tasks]
        spilled = sum(p.spill_bytes for r in scanned for p in r.partitions.values())
        per_row = sum(r.sample_bytes for r in scanned) / sum(r.sample_rows for r in scanned)
        cut(rt, job.id)
        units = rt.store.units(job.id)
        started = time.perf_counter()
        results = [write_unit(rt, job.id, u.unit_id) for u in units]
        seconds = time.perf_counter() - started
    return {"units": len(units), "seconds": seconds, "spilled": spilled, "read": sum(r["spill_bytes_read"] for r in results),
            "day_bytes": per_row * source.num_rows / days}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--units", type=int, default=26)
    args = parser.parse_args()
    source = readings(args.devices, args.days)
    print(f"{source.num_rows:,} rows: {args.devices:,} devices x {args.days} days at 1/min")
    one = run(source, args.days, "1GB")
    many = run(source, args.days, str(int(one["day_bytes"] / args.units)))
    for name, case in (("1 unit a day", one), (f"{args.units} units a day", many)):
        print(f"{name:<16} {case['units'] / args.days:>5.1f} units/day  write {case['seconds']:6.2f} s  "
              f"{case['seconds'] / source.num_rows * 1e9:6.1f} ns/row  read/spilled {case['read'] / case['spilled']:.3f}"
              f"  ({case['read'] / 1e6:,.1f} of {case['spilled'] / 1e6:,.1f} MB)")
    print(f"write s/row, {args.units} units / 1 unit: {many['seconds'] / one['seconds']:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
