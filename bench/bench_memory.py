"""Memory is set by the unit, not the job: peak RSS of a whole embedded job at 1x, 4x and 16x the rows,
and of validation at 1, 10 and 40 staged files of one size.

Not a test: it prints peak RSS, times and ratios beside their targets and asserts nothing.

    .venv/bin/python bench/bench_memory.py                 # 1,000 devices at 1/min; 4, 16 and 64 days
    .venv/bin/python bench/bench_memory.py --devices 300

Each case runs in a fresh subprocess (peak RSS is that process's ru_maxrss), on a source generated
beforehand into a temporary folder. 1x is 4 days: the smallest job that keeps both of this machine's
workers busy in every step. At 2 days the plan makes one scan task of both files (a task reads at
least 8 MB), so the scan, which writes each day it holds whole, runs on one thread and the job
peaks lower than its concurrency allows. Targets: job peak RSS at 4x and 16x within 20 % of 1x; validation
peak RSS flat within 20 % from 1 to 40 files, and its rows/s flat or rising.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])

JOB = """
import json, resource, sys, time
import timelake
folder, mode = sys.argv[1], sys.argv[2]
lake = timelake.connect(warehouse=folder + "/lake")
import pyarrow as pa
if mode == "validate":
    from timelake.steps.validate import validate
    job_id = open(folder + "/job").read()
    started = time.perf_counter()
    validate(lake.runtime, job_id)
    rows = sum(u.result["rows_written"] for u in lake.runtime.store.units(job_id))
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    sys.exit()
lake.create_table("bench.sensor", schema=pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()),
                  ("value", pa.float64())]), time_column="ts", series_key=["device_id"], partition_by="day")
started = time.perf_counter()
if mode == "job":
    job = lake.table("bench.sensor").backfill(source=folder + "/source/*.parquet")
    job.wait()
    report = job.report()
    rows = report["rows_written"]
else:
    from timelake.model.spec import JobSpec
    from timelake.steps.plan import cut, pending_pieces, plan, scan
    from timelake.steps.stage import stage
    from timelake.steps.write import write_unit
    rt = lake.runtime
    spec = JobSpec(table="bench.sensor", source=folder + "/source/*.parquet")
    lake.create_job(spec)
    plan(rt, spec.job_id)
    for task in pending_pieces(rt, spec.job_id):
        scan(rt, spec.job_id, task)
    cut(rt, spec.job_id)
    for unit in rt.store.units(spec.job_id):
        write_unit(rt, spec.job_id, unit.unit_id)
    stage(rt, spec.job_id)
    open(folder + "/job", "w").write(spec.job_id)
    rows = sum(u.result["rows_written"] for u in rt.store.units(spec.job_id))
print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_days(folder: Path, devices: int, days: int) -> None:
    """A file per day of every device at 1/min, ending three days ago."""
    (folder / "source").mkdir(parents=True)
    first = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=days + 3)
    names = np.array([f"dev-{i:05d}" for i in range(devices)])
    for day in range(days):
        start = np.datetime64((first + timedelta(days=day)).replace(tzinfo=None), "us")
        ts = np.tile(start + np.arange(1440) * np.timedelta64(60, "s"), devices)
        value = np.random.default_rng(day).normal(20, 5, devices * 1440).round(3)
        pq.write_table(pa.table({"ts": pa.array(ts).cast(SCHEMA.field("ts").type), "device_id": np.repeat(names, 1440),
                                 "value": value}, schema=SCHEMA), folder / "source" / f"day-{day:03d}.parquet")


def run(devices: int, days: int, mode: str) -> dict[str, float]:
    """``mode`` job: the whole job in one process; validate: staged in one process, validated in another."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        write_days(Path(tmp), devices, days)
        result = {}
        for step in (["stage", "validate"] if mode == "validate" else ["job"]):
            out = subprocess.run([sys.executable, "-c", JOB, tmp, step], capture_output=True, text=True, check=True,
                                 env={"PYTHONPATH": str(ROOT / "layers"), "PATH": "/usr/bin:/bin"})
            result = json.loads(out.stdout.strip().splitlines()[-1])
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1_000)
    parser.add_argument("--validate-devices", type=int, default=200)
    args = parser.parse_args()
    print(f"whole job, {args.devices:,} devices at 1/min (a day file = {args.devices * 1440:,} rows):")
    base = 4
    jobs = {days: run(args.devices, days, "job") for days in (base, 4 * base, 16 * base)}
    for days, r in jobs.items():
        print(f"  {days:>2} days {r['rows']:>12,} rows  {r['seconds']:6.1f} s  peak {r['peak_mb']:6.0f} MB"
              f"  peak / {base} days {r['peak_mb'] / jobs[base]['peak_mb']:.2f}  time / {base} days {r['seconds'] / jobs[base]['seconds']:5.1f}"
              "  (targets: peak <= 1.20)")
    print(f"validation, files of {args.validate_devices * 1440:,} rows:")
    checks = {files: run(args.validate_devices, files, "validate") for files in (1, 10, 40)}
    for files, r in checks.items():
        print(f"  {files:>2} file(s) {r['rows']:>12,} rows  {r['rows'] / r['seconds']:>12,.0f} rows/s  peak {r['peak_mb']:6.0f} MB"
              f"  peak / 1 file {r['peak_mb'] / checks[1]['peak_mb']:.2f}  (target <= 1.20)")


if __name__ == "__main__":
    main()
