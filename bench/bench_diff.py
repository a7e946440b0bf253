"""Diff benchmark: what the diff of a reprocess costs. A table loaded with a month of 1-minute readings
is reprocessed whole in replace mode under a calibration fix (every value scaled), once without the diff
and once with it; and the same as dry runs, where the diff is the prediction.

Not a test: it prints times, the steps' share and the ratios, and asserts nothing about speed.

    .venv/bin/python bench/bench_diff.py            # 300 devices x 30 days x 1-minute steps = 12.96M rows
    .venv/bin/python bench/bench_diff.py --quick    # 50 devices x 5 days, 1 round
    .venv/bin/python bench/bench_diff.py --layout device   # a source file per device (the scan shuffles)
    .venv/bin/python bench/bench_diff.py --target-file-size 1MB   # several units a day: main tasks spill main's rows

Every case runs in a fresh subprocess on its own copy of the loaded lake, round-robin, and the fastest
run of each counts; the ratios are also given per round (the cases of a round ran under the same load).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
START = datetime(2024, 1, 1, tzinfo=UTC)
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
TABLE = "bench.sensor"
CASES = [("replace", "replace, no diff"), ("replace_diff", "replace with diff"), ("dry", "dry run, no diff"),
         ("dry_diff", "dry run with diff (predicted)")]
STEPS = [("plan", "plan"), ("scan", "_scan_all"), ("cut", "cut"), ("main tasks", "_main_all"), ("write", "_write_all"),
         ("stage", "stage"), ("check", "_check_all"), ("validate", "validate"), ("publish", "publish")]


def data_dir(args: argparse.Namespace) -> Path:
    return HERE / ".data" / f"diff-{args.devices}x{args.days}x{args.step_minutes}-{args.layout}-{args.target_file_size}"


def generate(args: argparse.Namespace) -> None:
    """The export, raw and calibrated (raw * 1.01): one Parquet file per day (day-ordered, as historians
    export) or per device (every day of one device: the scan shuffles it into days)."""
    root = data_dir(args)
    if (root / "done").exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    per_day = 24 * 60 // args.step_minutes
    devices = np.array([f"dev-{i:04d}" for i in range(args.devices)])
    rng = np.random.default_rng(20240101)
    for name in ("v1", "v2"):
        (root / name).mkdir(parents=True)
    step = np.timedelta64(args.step_minutes * 60_000_000, "us")
    groups = range(args.days) if args.layout == "day" else range(args.devices)
    for group in groups:
        if args.layout == "day":
            begin = np.datetime64((START + timedelta(days=group)).replace(tzinfo=None), "us")
            ts = np.tile(begin + np.arange(per_day) * step, args.devices)
            names = np.repeat(devices, per_day)
        else:
            ts = np.datetime64(START.replace(tzinfo=None), "us") + np.arange(per_day * args.days) * step
            names = np.repeat(devices[group:group + 1], len(ts))
        raw = np.round(rng.normal(20, 5, len(ts)), 3)
        for name, values in (("v1", raw), ("v2", np.round(raw * 1.01, 6))):
            pq.write_table(pa.table({"ts": pa.array(ts).cast(SCHEMA.field("ts").type), "device_id": names, "value": values},
                                    schema=SCHEMA), root / name / f"{args.layout}-{group:04d}.parquet")
    lake_root = root / "work" / "lake"  # prepared where every case runs: the catalog keeps absolute paths
    subprocess.run([sys.executable, __file__, "--prepare", "--work", str(lake_root), *_sizes(args)], check=True)
    shutil.copytree(lake_root, root / "loaded")
    (root / "done").write_text("")


def _sizes(args: argparse.Namespace) -> list[str]:
    return ["--devices", str(args.devices), "--days", str(args.days), "--step-minutes", str(args.step_minutes),
            "--max-concurrency", str(args.max_concurrency), "--layout", args.layout, "--target-file-size", args.target_file_size]


def prepare(args: argparse.Namespace) -> None:
    """The loaded lake every case starts from: the table holding the raw export, published."""
    import timelake

    lake = timelake.connect(warehouse=args.work)
    table = lake.create_table(TABLE, SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                              target_file_size=args.target_file_size)
    table.backfill(source=str(data_dir(args) / "v1" / "*.parquet"), diff=False, max_concurrency=args.max_concurrency).wait()


def child(args: argparse.Namespace) -> None:
    """One timed case in this fresh process; its result as JSON in --out."""
    import timelake
    import timelake.runner as runner

    steps: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                steps[name] = steps.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    for name, attr in STEPS:
        setattr(runner, attr, timed(name, getattr(runner, attr)))
    lake = timelake.connect(warehouse=args.work)
    table = lake.table(TABLE)
    end = (START + timedelta(days=args.days)).date().isoformat()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    job = table.backfill(source=str(data_dir(args) / "v2" / "*.parquet"), mode="replace", start=START.date().isoformat(),
                         end=end, dry_run=args.case.startswith("dry"), diff=args.case.endswith("_diff"),
                         max_concurrency=args.max_concurrency).wait()
    seconds = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    report = job.report()
    totals = (report.get("diff") or {}).get("totals")
    Path(args.out).write_text(json.dumps({
        "seconds": seconds, "steps": steps, "phase": report["phase"], "rows": report["rows_in_source"],
        "units": report["units"], "diff": totals,
        "cpu_seconds": cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime,
        "maxrss_mb": cpu1.ru_maxrss / 1024,
    }))


def run(args: argparse.Namespace, case: str) -> dict[str, Any]:
    """One case on the loaded lake, restored at the path it was prepared at."""
    work = data_dir(args) / "work" / "lake"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(data_dir(args) / "loaded", work)
    out = work.parent / f"{case}.json"
    result = subprocess.run([sys.executable, __file__, "--case", case, "--work", str(work), "--out", str(out), *_sizes(args)],
                            capture_output=True, text=True)
    shutil.rmtree(work, ignore_errors=True)
    if result.returncode != 0:
        raise SystemExit(f"case {case} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=300)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--step-minutes", type=int, default=1)
    parser.add_argument("--layout", choices=["day", "device"], default="day", help="a source file per day or per device")
    parser.add_argument("--target-file-size", default="128MB",
                        help="the table's; below a day's bytes a day is cut into several units, whose main rows the main tasks spill")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-concurrency", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="50 devices x 5 days, 1 round")
    parser.add_argument("--only", nargs="+", choices=[c for c, _ in CASES])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.devices, args.days, args.rounds = 50, 5, 1
    if args.prepare:
        prepare(args)
        return
    if args.case:
        child(args)
        return
    rows = args.devices * args.days * 24 * 60 // args.step_minutes
    print(f"diff benchmark: {args.devices} devices x {args.days} days, a row every {args.step_minutes} min = {rows:,} rows "
          f"on main and in the source, a file per {args.layout}, target file size {args.target_file_size}; "
          f"max_concurrency {args.max_concurrency}")
    generate(args)
    cases = [(c, label) for c, label in CASES if not args.only or c in args.only]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c, _ in cases}
    for round_ in range(args.rounds):
        for case, _ in cases:
            runs[case].append(run(args, case))
            print(f"  round {round_ + 1} {case:<13} {runs[case][-1]['seconds']:6.2f} s", flush=True)
    print()
    best = {case: min(found, key=lambda r: r["seconds"]) for case, found in runs.items()}
    names = [n for n, _ in STEPS]
    print(f"{'case':<32}{'total':>8}  " + "".join(f"{n:>11}" for n in names) + f"{'peak MB':>9}")
    for case, label in cases:
        r = best[case]
        print(f"{label:<32}{r['seconds']:7.2f}s  " + "".join(f"{r['steps'].get(n, 0.0):10.2f}s" for n in names)
              + f"{r['maxrss_mb']:9.0f}")
    for with_diff, without in (("replace_diff", "replace"), ("dry_diff", "dry")):
        if with_diff in best and without in best:
            pairs = sorted(a["seconds"] / b["seconds"] for a, b in zip(runs[with_diff], runs[without], strict=False))  # a failed round leaves one case a run short
            print(f"{with_diff} / {without}: best {best[with_diff]['seconds'] / best[without]['seconds']:.2f}, "
                  f"per round {pairs[len(pairs) // 2]:.2f} [{pairs[0]:.2f}-{pairs[-1]:.2f}]; "
                  f"+{best[with_diff]['seconds'] - best[without]['seconds']:.2f} s for {rows:,} rows")
    for case in ("replace_diff", "dry_diff"):
        if case in best:
            print(f"{case}: diff totals {best[case]['diff']}")


if __name__ == "__main__":
    main()
