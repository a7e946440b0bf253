"""Cost linear in rows: the backfill at 1x and at K x the rows (K times the days), time and peak memory.

Not a test: it prints both sides of each ratio from the same round and asserts nothing.

    .venv/bin/python bench/bench_scale.py                       # 300 devices x 30 days (12.96M rows) and x 4
    .venv/bin/python bench/bench_scale.py --days 10 --factor 4 --repeat 3 --floor

It drives bench_backfill.py's cases (same data, same frozen engine, a fresh subprocess per run, the
process tree's peak PSS sampled every 0.2 s): each round runs the day-ordered backfill at 1x, then at
K x (and with --floor the two-core floor a2 at both sizes, for b/a2 at K x). Targets: time at 4x / time
at 1x <= 4.2; peak memory at 4x within 20 % of 1x.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import bench_backfill as bb

TIME_TARGET = 4.2
MEMORY_TARGET = 1.2


def _args(base: argparse.Namespace, days: int) -> argparse.Namespace:
    args = argparse.Namespace(**vars(base))
    args.days = days
    return args


def _run(args: argparse.Namespace, case: str, env: dict[str, str]) -> dict[str, Any]:
    work = bb.DATA / "work" / f"scale-{case}-{args.days}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _, status = bb.spawn(args, case, "prepare", work, env)
        if status != "ok":
            raise SystemExit(f"{case} at {args.days} days: prepare {status}")
        result, status = bb.spawn(args, case, "run", work, env)
        if result is None:
            raise SystemExit(f"{case} at {args.days} days: {status}")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=300)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--step-minutes", type=int, default=1)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=2)
    parser.add_argument("--floor", action="store_true", help="also run the two-core floor a2 at both sizes")
    base = parser.parse_args()
    base.upsert_rows = 1000
    sizes = [base.days, base.days * base.factor]
    print(f"scale benchmark: {base.devices} devices x {sizes[0]} and {sizes[1]} days at {base.step_minutes}-minute "
          f"steps, max_concurrency={base.max_concurrency}; load average {bb._load()}")
    engine, env = bb.freeze_engine()
    print(f"engine: {bb._git_describe()}, fingerprint {engine}")
    for days in sizes:
        subprocess.run([sys.executable, str(Path(bb.__file__).resolve()), "--generate", "--devices", str(base.devices),
                        "--days", str(days), "--step-minutes", str(base.step_minutes), "--upsert-rows", "1000"],
                       check=True)
    cases = ["backfill_day", *(["floor_threads"] if base.floor else [])]
    rounds = []
    for i in range(base.repeat):
        row = {(case, days): _run(_args(base, days), case, env) for days in sizes for case in cases}
        rounds.append(row)
        b1, bk = row[("backfill_day", sizes[0])], row[("backfill_day", sizes[1])]
        line = (f"  round {i + 1}: b at 1x {b1['seconds']:.2f} s (cpu {b1['cpu_timed']:.2f}, peak {b1['peak_pss_mb']:.0f} MB), "
                f"at {base.factor}x {bk['seconds']:.2f} s (cpu {bk['cpu_timed']:.2f}, peak {bk['peak_pss_mb']:.0f} MB)")
        if base.floor:
            f1, fk = row[("floor_threads", sizes[0])], row[("floor_threads", sizes[1])]
            line += f"; a2 {f1['seconds']:.2f} / {fk['seconds']:.2f} s"
        print(line + f"; load {bb._load()}", flush=True)
    print()

    def median(top: tuple[str, int], bottom: tuple[str, int], key: str) -> str:
        values = sorted(r[top][key] / r[bottom][key] for r in rounds)
        return f"{statistics.median(values):.2f} [{values[0]:.2f}-{values[-1]:.2f}]"

    one, many = ("backfill_day", sizes[0]), ("backfill_day", sizes[1])
    print(f"{'ratio (median [min-max] of rounds)':<40} {'wall':<18} {'cpu t':<18} target")
    print(f"{f'b time {base.factor}x / 1x':<40} {median(many, one, 'seconds'):<18} {median(many, one, 'cpu_timed'):<18} "
          f"<= {TIME_TARGET}")
    print(f"{f'b peak memory {base.factor}x / 1x':<40} {median(many, one, 'peak_pss_mb'):<18} {'':<18} <= {MEMORY_TARGET}")
    if base.floor:
        for days in sizes:
            print(f"{f'b/a2 at {days} days':<40} {median(('backfill_day', days), ('floor_threads', days), 'seconds'):<18} "
                  f"{median(('backfill_day', days), ('floor_threads', days), 'cpu_timed'):<18}")
    print(f"load average at the end: {bb._load()}")


if __name__ == "__main__":
    main()
