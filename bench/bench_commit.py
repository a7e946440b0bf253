"""Stage and publish of a job with many staged files, against a bare pyiceberg fast append of them.

Not a test: it prints seconds (wall and CPU), ratios and targets, and asserts nothing about speed.

    .venv/bin/python bench/bench_commit.py                 # 10,000 files, 3 rounds, ~2 min
    .venv/bin/python bench/bench_commit.py --files 2000 --repeat 5

The files (one small Parquet file per day partition, written once into bench/.data/) stand for the
units a job wrote: each round makes a fresh lake, records a job whose units are all written (as the
write step leaves them), and times the runner's ``stage`` and ``publish`` step functions. The floor
is what a pyiceberg user does with DataFiles already in hand: ONE ``fast_append`` of the same files
into a fresh table of the same schema and partition spec (the DataFiles built from the footers
beforehand, untimed). Floor, stage and publish alternate within each round, so a busy machine slows
all three alike; the rounds are reported one by one, with the load average.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
START = datetime(1990, 1, 1, tzinfo=timezone.utc)
US_PER_DAY = 86_400_000_000
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
TABLE = "bench.sensor"
TARGET = 1.5  # stage and publish: at most this many times the bare fast append


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _lake(root: Path) -> Any:
    import timelake

    return timelake.connect(warehouse=root / "lake")


def _create(lake: Any) -> Any:
    return lake.create_table(TABLE, SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                             target_file_size="128MB")


def write_files(count: int) -> tuple[Path, list[dict[str, Any]]]:
    """``count`` day files of 12 rows (2 devices x 6 readings), written once with the engine's writer,
    and the unit results the write step would have recorded for them."""
    from timelake.steps.write import write_file

    root = DATA / f"commit-f{count}"
    marker = root / "units.json"
    if marker.exists():
        return root, json.loads(marker.read_text())
    shutil.rmtree(root, ignore_errors=True)
    lake = _lake(root / "schema")
    table = _create(lake).iceberg
    target = table.schema().as_arrow()
    base = int(START.timestamp()) * 1_000_000
    results = []
    for day in range(count):
        ts = base + day * US_PER_DAY + np.repeat(np.arange(6, dtype=np.int64) * 3_600_000_000, 2)
        rows = pa.Table.from_arrays([pa.array(ts, pa.int64()).cast(target.field("ts").type),
                                     pa.array(["dev-0", "dev-1"] * 6, target.field("device_id").type),
                                     pa.array(np.round(np.random.default_rng(day).normal(20, 2, 12), 3))], schema=target)
        path = str(root / "files" / f"day-{day:05d}.parquet")
        results.append({"rows_in": 12, "rows_written": 12, "rows_duplicate_in_source": 0,
                        "rows_conflicting_existing": 0, "duplicate_sum": 0.0, "conflict_sum": 0.0,
                        "spec_id": 0, "value": day, "spill_bytes_read": 0, "seconds": 0.0,
                        **write_file(table, rows, path)})
    shutil.rmtree(root / "schema")
    marker.write_text(json.dumps(results))
    return root, results


def record_job(lake: Any, results: list[dict[str, Any]]) -> str:
    """A job whose every unit is written, as the write step leaves it (phase ``written``)."""
    from timelake.model.spec import JobSpec
    from timelake.ports.store import UnitRecord

    rt = lake.runtime
    job = lake.create_job(JobSpec(table=TABLE, source="bench/.data/commit-files/*.parquet"))
    units = []
    for r in results:
        day = r["value"]
        units.append(UnitRecord(
            unit_id=f"day-{day}-s0-0of1", status="done", result=r,
            info={"partition": f"day-{day}-s0", "spec_id": 0, "transform": "day", "value": day,
                  "start": day * US_PER_DAY, "end": (day + 1) * US_PER_DAY, "buckets": None, "spill": [],
                  "rows_estimate": 12}))
    rt.store.put_units(job.id, units)
    start = int(START.timestamp()) * 1_000_000 // US_PER_DAY * US_PER_DAY
    rows = sum(r["rows_written"] for r in results)
    rt.store.update_job(
        job.id, "written", branch=f"backfill/{job.id}", base_snapshot_id=None, range_start=results[0]["value"] * US_PER_DAY,
        range_end=(results[-1]["value"] + 1) * US_PER_DAY, rows_in_source=rows, rows_in_scope=rows,
        rows_rejected={}, rows_outside_range=0, rows_outside_retention=0, units_total=len(units),
        partition_sums={}, check_column="value", time_range={"min": None, "max": None}, source_gaps=[],
        planned_at_us=start)
    return job.id


def floor(work: Path, files: list[Any]) -> dict[str, float]:
    """ONE pyiceberg fast append of ``files`` (prebuilt DataFiles) into a fresh table."""
    from pyiceberg.catalog.sql import SqlCatalog

    from timelake.model.layout import fresh_schema

    (work / "floor").mkdir(parents=True)
    catalog = SqlCatalog("floor", uri=f"sqlite:///{work}/floor/catalog.db", warehouse=f"file://{work}/floor")
    catalog.create_namespace("bench")
    spec_source = _create(_lake(work / "spec")).iceberg
    table = catalog.create_table(TABLE, schema=fresh_schema(SCHEMA), partition_spec=spec_source.spec())
    wall, cpu = time.perf_counter(), time.process_time()
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            for f in files:
                append.append_data_file(f)
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def ours(work: Path, results: list[dict[str, Any]], profile: int = 0) -> dict[str, dict[str, float]]:
    """The runner's stage and publish steps on a freshly recorded job (validation is marked passed);
    ``profile``: print that many of the most expensive functions of each step (cProfile, CPU time)."""
    from timelake.steps.publish import publish
    from timelake.steps.stage import stage

    lake = _lake(work / "ours")
    _create(lake)
    rt = lake.runtime
    job_id = record_job(lake, results)
    timings = {}
    for name, step in (("stage", stage), ("publish", publish)):
        profiler = cProfile.Profile(time.process_time) if profile else None
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        step(rt, job_id)
        timings[name] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
        if profiler:
            profiler.disable()
            print(f"--- {name}")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(profile)
        if name == "stage":
            rt.store.update_job(job_id, "validated")
    phase = rt.store.get_job(job_id).phase
    files = len(lake.table(TABLE).iceberg.inspect.files())
    if phase != "published" or files != len(results):
        raise SystemExit(f"publish ended in phase {phase} with {files} files on main, expected {len(results)}")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile stage and publish (one round) and print their N costliest functions")
    args = parser.parse_args()
    from timelake.model.commit import data_file_from_result

    print(f"stage/publish benchmark  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"load average {_load()}")
    made = time.perf_counter()
    root, results = write_files(args.files)
    print(f"{args.files:,} staged files (one a day from {START:%Y-%m-%d} to "
          f"{START + timedelta(days=args.files - 1):%Y-%m-%d}) ready in {time.perf_counter() - made:.1f} s")
    reference = _create(_lake(root / "reference")).iceberg
    files = [data_file_from_result(reference, r) for r in results]
    shutil.rmtree(root / "reference")
    rounds = []
    for i in range(args.repeat):
        work = DATA / "work" / "commit"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        row = {"floor": floor(work, files), **ours(work, results, args.profile), "load": _load()}
        shutil.rmtree(work, ignore_errors=True)
        rounds.append(row)
        print(f"  round {i + 1}: fast append {row['floor']['wall']:.2f} s (cpu {row['floor']['cpu']:.2f}), "
              f"stage {row['stage']['wall']:.2f} s (cpu {row['stage']['cpu']:.2f}), "
              f"publish {row['publish']['wall']:.2f} s (cpu {row['publish']['cpu']:.2f}); load {row['load']}",
              flush=True)
    print()
    print(f"{'ratio (median of rounds)':<28} {'wall':>6} {'cpu':>6} {'target':>8}")
    for name in ("stage", "publish"):
        wall = statistics.median(r[name]["wall"] / r["floor"]["wall"] for r in rounds)
        cpu = statistics.median(r[name]["cpu"] / r["floor"]["cpu"] for r in rounds)
        print(f"{name + ' / fast append':<28} {wall:>6.2f} {cpu:>6.2f} {'<= ' + str(TARGET):>8}  "
              f"{'ok' if wall <= TARGET else 'OVER'}")
    print(f"load average at the end: {_load()}")


if __name__ == "__main__":
    main()
