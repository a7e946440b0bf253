"""Stage and publish of a job with many staged files, against a bare pyiceberg fast append of them.

Not a test: it prints seconds (wall and CPU), ratios and targets, and asserts nothing about speed.

    .venv/bin/python bench/bench_commit.py                 # 10,000 files, best of 3 rounds, ~1 min (the first run writes the files: +10 s)
    .venv/bin/python bench/bench_commit.py --files 2000 --repeat 5

The files (one small Parquet file per day partition, written once into bench/.data/) stand for the
units a job wrote: each round makes a fresh lake, records a job whose units are all written (as the
write step leaves them), and times the runner's ``stage`` and ``publish`` step functions. The floor
is what a pyiceberg user does with DataFiles already in hand: ONE ``fast_append`` of the same files
into a fresh table of the same schema and partition spec (the DataFiles built from the footers
beforehand, untimed). Floor, stage and publish alternate within each round, so a busy machine slows
all three alike; the rounds are reported one by one, with the load average, and the ratios are of
the best (fastest) round of each, in wall and in CPU seconds of the process.

"publish" is the whole step as the runner calls it: the chunk commit, removing the branch and the
staging snapshot, the provenance row, and the coverage companion update (the readers' completion
signal, done inside publish before it returns); the last two are also printed on their own. Stage
and publish pause Python's cyclic garbage collector while they run (`commit.collector_paused`), so
the floor is also timed that way ("fast append, gc paused"), and the ratios against it printed too.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
START = datetime(1990, 1, 1, tzinfo=UTC)
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
    from timelake.model.parquet_settings import ParquetSettings
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
                        **write_file(table, rows, path, ParquetSettings.from_properties(table.properties),
                                     objects=lake.runtime.objects)})
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


def floor(work: Path, files: list[Any], paused: bool = False) -> dict[str, float]:
    """ONE pyiceberg fast append of ``files`` (prebuilt DataFiles) into a fresh table; ``paused``: with
    the cyclic garbage collector paused, as our steps run."""
    from pyiceberg.catalog.sql import SqlCatalog

    from timelake.model.layout import fresh_schema

    work = work / ("floor-paused" if paused else "floor")
    work.mkdir(parents=True)
    catalog = SqlCatalog("floor", uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}")
    catalog.create_namespace("bench")
    spec_source = _create(_lake(work / "spec")).iceberg
    table = catalog.create_table(TABLE, schema=fresh_schema(SCHEMA), partition_spec=spec_source.spec())
    if paused:
        gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
            for f in files:
                append.append_data_file(f)
        return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
    finally:
        gc.enable()


class _Timed:
    """Wraps a module function to add up the wall and CPU seconds of its calls (a part of a step)."""

    def __init__(self, module: Any, name: str) -> None:
        self.module, self.name, self.original = module, name, getattr(module, name)
        self.wall = self.cpu = 0.0

    def __enter__(self) -> _Timed:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return self.original(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - wall
                self.cpu += time.process_time() - cpu

        setattr(self.module, self.name, timed)
        return self

    def __exit__(self, *exc: Any) -> None:
        setattr(self.module, self.name, self.original)

    def seconds(self) -> dict[str, float]:
        return {"wall": self.wall, "cpu": self.cpu}


def ours(work: Path, results: list[dict[str, Any]], profile: int = 0) -> dict[str, dict[str, float]]:
    """The runner's stage and publish steps on a freshly recorded job (validation is marked passed);
    ``profile``: print that many of the most expensive functions of each step (cProfile, CPU time)."""
    from timelake.followup import completion, provenance
    from timelake.steps.publish import publish
    from timelake.steps.stage import stage

    lake = _lake(work / "ours")
    _create(lake)
    rt = lake.runtime
    job_id = record_job(lake, results)
    timings = {}
    for name, step in (("stage", stage), ("publish", publish)):
        profiler = cProfile.Profile(time.process_time) if profile else None
        with _Timed(completion, "update") as coverage, _Timed(provenance, "record") as record:
            wall, cpu = time.perf_counter(), time.process_time()
            if profiler:
                profiler.enable()
            step(rt, job_id)
            timings[name] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
        if name == "publish":
            timings["coverage"], timings["provenance"] = coverage.seconds(), record.seconds()
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

    print(f"stage/publish benchmark  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"load average {_load()}")
    made = time.perf_counter()
    root, results = write_files(args.files)
    print(f"{args.files:,} staged files (one a day from {START:%Y-%m-%d} to "
          f"{START + timedelta(days=args.files - 1):%Y-%m-%d}) ready in {time.perf_counter() - made:.1f} s")
    reference_lake = _lake(root / "reference")
    reference = _create(reference_lake).iceberg
    files = [data_file_from_result(reference, r, objects=reference_lake.runtime.objects) for r in results]
    shutil.rmtree(root / "reference")
    rounds = []
    for i in range(args.repeat):
        work = DATA / "work" / "commit"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        row = {"floor": floor(work, files), **ours(work, results, args.profile),
               "floor_paused": floor(work, files, paused=True), "load": _load()}
        shutil.rmtree(work, ignore_errors=True)
        rounds.append(row)
        print(f"  round {i + 1}: " + ", ".join(f"{name} {row[key]['wall']:.2f} s (cpu {row[key]['cpu']:.2f})" for key, name in (
            ("floor", "fast append"), ("stage", "stage"), ("publish", "publish"), ("coverage", "of which coverage"),
            ("provenance", "provenance"), ("floor_paused", "fast append gc paused"))) + f"; load {row['load']}", flush=True)
    best = {key: {unit: min(r[key][unit] for r in rounds) for unit in ("wall", "cpu")}
            for key in ("floor", "floor_paused", "stage", "publish", "coverage", "provenance")}
    print()
    print(f"best of {len(rounds)} round(s), seconds      {'wall':>6} {'cpu':>6}")
    for key, name in (("floor", "fast append (the floor)"), ("floor_paused", "fast append, gc paused"),
                      ("stage", "stage"), ("publish", "publish (whole step)"),
                      ("coverage", "  of which coverage update"), ("provenance", "  of which provenance row")):
        print(f"  {name:<32} {best[key]['wall']:>6.2f} {best[key]['cpu']:>6.2f}")
    print()
    print(f"{'ratio (best of rounds)':<36} {'wall':>6} {'cpu':>6} {'target':>8}")
    for name in ("stage", "publish"):
        for floor_key, against in (("floor", "fast append"), ("floor_paused", "fast append, gc paused")):
            wall = best[name]["wall"] / best[floor_key]["wall"]
            cpu = best[name]["cpu"] / best[floor_key]["cpu"]
            verdict = ("ok" if max(wall, cpu) <= TARGET else "OVER") if floor_key == "floor" else ""
            print(f"{name + ' / ' + against:<36} {wall:>6.2f} {cpu:>6.2f} {'<= ' + str(TARGET) if verdict else '':>8}  {verdict}")
    print(f"load average at the end: {_load()}")


if __name__ == "__main__":
    main()
