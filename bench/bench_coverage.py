"""Coverage benchmark: the coverage map of a 3-year day-partitioned table from metadata alone, at
5k, 10k and 20k data files. Target: under 2 s at 20k files.

Not a test: it prints times and asserts nothing about speed.

    .venv/bin/python bench/bench_coverage.py                 # 5,000 10,000 20,000 files, 3 runs each
    .venv/bin/python bench/bench_coverage.py --files 20000 --repeat 5
    .venv/bin/python bench/bench_coverage.py --series-days 1095    # --series over real files instead

The tables are built fast by committing prebuilt DataFile entries (record counts, time bounds, day
partition) in 10 commits, one in three a backfill publish (its snapshot summary names a job), the way
the engine commits files it wrote. The entries point at Parquet paths that do not exist: the
coverage map must never open a data file, so a run that tried would fail.

``--series`` must read files (the series-key column of each one in range), so ``--series-days N``
backfills N days of real data instead (100 devices hourly, one file per day) and times the map with
and without it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers"))

from pyiceberg.conversions import to_bytes  # noqa: E402
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat  # noqa: E402
from pyiceberg.typedef import Record  # noqa: E402

import timelake  # noqa: E402
from timelake.followup.coverage import EXPECTED_INTERVAL, EXPECTED_SERIES, compute  # noqa: E402
from timelake.model.commit import JOB_PROPERTY, STEP_PROPERTY, append_files  # noqa: E402
from timelake.model.timeutil import US_PER_DAY, to_micros  # noqa: E402

SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
DAYS = 3 * 365
COMMITS = 10


def build(root: Path, files: int) -> tuple[timelake.Lake, float]:
    lake = timelake.connect(warehouse=root)
    table = lake.create_table("bench.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", properties={EXPECTED_INTERVAL: "PT1M", EXPECTED_SERIES: "100"})
    iceberg = table.iceberg
    ts_field = iceberg.schema().find_field("ts")
    first_day = to_micros(datetime.now(UTC) - timedelta(days=DAYS)) // US_PER_DAY
    rng = np.random.default_rng(0)
    days = first_day + np.sort(rng.integers(0, DAYS, files))
    started = time.perf_counter()
    for c, chunk in enumerate(np.array_split(np.arange(files), COMMITS)):
        batch = []
        for i in chunk:
            lo = int(days[i]) * US_PER_DAY + int(rng.integers(0, 3_600)) * 1_000_000
            hi = lo + int(rng.integers(3_600, 20 * 3_600)) * 1_000_000
            f = DataFile.from_args(
                content=DataFileContent.DATA, file_path=f"file://{root}/absent/{i}.parquet", file_format=FileFormat.PARQUET,
                partition=Record(int(days[i])), record_count=int(rng.integers(1_000, 150_000)), file_size_in_bytes=1 << 20,
                lower_bounds={ts_field.field_id: to_bytes(ts_field.field_type, lo)},
                upper_bounds={ts_field.field_id: to_bytes(ts_field.field_type, hi)},
                sort_order_id=None, equality_ids=None, key_metadata=None,
            )
            f.spec_id = iceberg.spec().spec_id
            batch.append(f)
        props = {JOB_PROPERTY: f"bf-bench-{c}", STEP_PROPERTY: "publish"} if c % 3 == 0 else {}
        with iceberg.transaction() as tx:
            append_files(tx, iceberg, batch, "main", props)
        iceberg = iceberg.refresh()
    return lake, time.perf_counter() - started


def series(days: int, repeat: int) -> None:
    """The day map with and without --series over a table of real files, one per day."""
    root = Path(tempfile.mkdtemp(prefix="bench-coverage-series-"))
    try:
        lake = timelake.connect(warehouse=root)
        table = lake.create_table("bench.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                                  partition_by="day")
        first = (to_micros(datetime.now(UTC)) // US_PER_DAY - days) * US_PER_DAY
        hours, devices = days * 24, 100
        ts = np.repeat(first + np.arange(hours, dtype=np.int64) * 3_600_000_000, devices)
        names = np.tile(np.array([f"dev-{i:03d}" for i in range(devices)]), hours)
        rows = pa.table({"ts": pa.array(ts).cast(SCHEMA.field("ts").type), "device_id": names,
                         "value": np.random.default_rng(0).random(len(ts))}, schema=SCHEMA)
        table.backfill(source=rows).wait()
        timed = {}
        for with_series in (False, True):
            runs = []
            for _ in range(repeat):
                started = time.perf_counter()
                cmap = compute(lake.runtime, "bench.sensor", by="day", series=with_series)
                runs.append(time.perf_counter() - started)
            timed[with_series] = min(runs)
        files = sum(b.files for b in cmap.buckets)
        assert files == days and all(len(b.series or {}) == devices for b in cmap.buckets if b.rows)
        print(f"{files:,} real files: by day {timed[False]:.2f} s, with --series {timed[True]:.2f} s "
              f"({timed[True] / files * 1000:.2f} ms per file read)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[5_000, 10_000, 20_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--series-days", type=int, help="time --series over this many days of real files instead")
    args = parser.parse_args()
    if args.series_days:
        series(args.series_days, args.repeat)
        return
    print(f"{'files':>7} {'build s':>8} {'by day s':>9} {'median':>7} {'by hour s':>10} {'by month s':>11} "
          f"{'buckets':>8} {'complete/partial/gap':>21}  target by day < 2 s")
    for n in args.files:
        root = Path(tempfile.mkdtemp(prefix="bench-coverage-"))
        try:
            lake, built = build(root, n)
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                cmap = compute(lake.runtime, "bench.sensor", by="day")
                times.append(time.perf_counter() - started)
            assert sum(b.files for b in cmap.buckets) >= n and not any(b.estimated for b in cmap.buckets)
            started = time.perf_counter()
            compute(lake.runtime, "bench.sensor", by="hour")
            hour = time.perf_counter() - started
            started = time.perf_counter()
            compute(lake.runtime, "bench.sensor", by="month")
            month = time.perf_counter() - started
            c = cmap.counts()
            print(f"{n:>7,} {built:>8.2f} {min(times):>9.2f} {statistics.median(times):>7.2f} {hour:>10.2f} {month:>11.2f} "
                  f"{len(cmap.buckets):>8,} {c['complete']:>7}/{c['partial']}/{c['gap']:<7}  "
                  f"{'ok' if min(times) < 2 else 'MISSED'}")
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
