"""PostgreSQL migration benchmark: timelake backfill from a local PostgreSQL against the floor of
reading PostgreSQL at all, on the same rows, with 1, 2 and 4 parallel readers.

Not a test: it prints times, rows/s and ratios, and asserts nothing about speed.

    .venv/bin/python bench/bench_postgres.py                  # 10M rows (100 devices x 100,000 minutes)
    .venv/bin/python bench/bench_postgres.py --rows 1000000 --readers 1 2
    .venv/bin/python bench/bench_postgres.py --rows 3000000 --readers 1 --repeat 5   # alternating rounds, best of 5

  floor     k processes, each: ``COPY (SELECT * FROM readings WHERE ts in its 1/k of the range) TO
            STDOUT (FORMAT binary)`` decoded to Arrow (the ADBC driver does exactly that, in C) and
            written to one zstd Parquet file. Nothing is sorted, mapped, checked or committed.
  backfill  ``tbl.backfill(source="postgresql://...?table=public.readings",
            source_max_connections=k, source_rows_per_second=0)`` into an empty day-partitioned
            table: plan -> scan -> cut -> write -> stage -> validate -> publish. ``scan`` is the
            part that reads the database (read, map, spill by partition) on k connections; the
            writers are the default max_concurrency, the machine's cores (k when k is larger).

The server is a throwaway PostgreSQL 15 started here (tests/sources/conftest.py), statement
logging off, on the same machine as the readers, so reader and server share the CPUs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.sources.conftest import PgServer, running_postgres  # noqa: E402

START = datetime(2024, 1, 1, tzinfo=UTC)
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])


def load(server: PgServer, rows: int, devices: int) -> tuple[int, int]:
    """``readings`` with ``rows`` rows at 1-minute cadence, in time order, indexed on ts; returns its
    [min, max] in epoch microseconds."""
    minutes = rows // devices
    server.sql(f"""
        CREATE TABLE readings AS
        SELECT '{START.isoformat()}'::timestamptz + m * interval '1 minute' AS ts,
               'dev-' || lpad(d::text, 4, '0') AS device_id,
               round(((m * 7 + d * 13) % 100000)::numeric / 1000, 3)::float8 AS value
        FROM generate_series(0, {minutes - 1}) AS m, generate_series(0, {devices - 1}) AS d""")
    server.sql("CREATE INDEX ON readings (ts)")
    server.sql("VACUUM ANALYZE readings")
    lo, hi = server.sql("SELECT (extract(epoch from min(ts)) * 1e6)::int8 AS lo, "
                        "(extract(epoch from max(ts)) * 1e6)::int8 AS hi FROM readings").to_pylist()[0].values()
    return lo, hi


def _copy_slice(uri: str, lo: int, hi: int, path: str) -> int:
    from adbc_driver_postgresql import dbapi

    def literal(us: int) -> str:
        return f"to_timestamp({us} / 1e6)"

    with dbapi.connect(uri, autocommit=True) as con, con.cursor() as cur:
        cur.execute(f"SELECT * FROM readings WHERE ts >= {literal(lo)} AND ts < {literal(hi)}")
        reader = cur.fetch_record_batch()
        rows = 0
        with pq.ParquetWriter(path, reader.schema, compression="zstd") as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    return rows


def floor(server: PgServer, lo: int, hi: int, readers: int, out: Path) -> tuple[float, int]:
    edges = [lo + (hi + 1 - lo) * i // readers for i in range(readers)] + [hi + 1]
    jobs = [(server.uri(), a, b, str(out / f"slice-{i}.parquet")) for i, (a, b) in enumerate(pairwise(edges))]
    started = time.perf_counter()
    with multiprocessing.get_context("forkserver").Pool(readers) as pool:
        rows = sum(pool.starmap(_copy_slice, jobs))
    return time.perf_counter() - started, rows


def writers(readers: int) -> int:
    """The job's max_concurrency: the machine's cores (the default), or more to allow that many readers."""
    return max(readers, os.cpu_count() or 1)


def backfill(server: PgServer, readers: int, warehouse: Path) -> tuple[float, float, dict]:
    import timelake
    import timelake.runner as runner

    lake = timelake.connect(warehouse=warehouse)
    table = lake.create_table("bench.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", target_file_size="128MB")
    scan_seconds = []
    scan_all = runner._scan_all

    def timed_scan(*args, **kwargs):
        began = time.perf_counter()
        try:
            return scan_all(*args, **kwargs)
        finally:
            scan_seconds.append(time.perf_counter() - began)

    runner._scan_all = timed_scan
    try:
        started = time.perf_counter()
        job = table.backfill(source=server.uri(table="public.readings"), max_concurrency=writers(readers),
                             source_max_connections=readers, source_rows_per_second=0).wait()
        seconds = time.perf_counter() - started
    finally:
        runner._scan_all = scan_all
    return seconds, sum(scan_seconds), job.report()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=1, help="rounds; floor and backfill alternate, the best of each is compared")
    args = parser.parse_args()
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, pyarrow {pa.__version__}, "
          f"PostgreSQL 15 on the same machine")
    with running_postgres(log_statement="'none'", log_min_duration_statement="-1",
                          shared_buffers="'1GB'", max_wal_size="'4GB'") as server:
        began = time.perf_counter()
        lo, hi = load(server, args.rows, args.devices)
        rows = server.sql("SELECT count(*)::int8 AS n FROM readings").column(0)[0].as_py()
        print(f"loaded {rows:,} rows ({args.devices} devices x 1-minute steps) in {time.perf_counter() - began:.0f} s")
        header = f"{'readers':>7} | {'floor s':>8} {'rows/s':>11} | {'backfill s':>10} {'rows/s':>11} {'ratio':>6} | " \
                 f"{'scan s':>7} {'rows/s':>11} {'ratio':>6} | {'load':>5}"
        print(header)
        print("-" * len(header))
        best: dict[int, list[float]] = {}
        for _ in range(args.repeat):
            for readers in args.readers:
                work = Path(tempfile.mkdtemp(prefix="timelake-bench-pg-"))
                load_avg = os.getloadavg()[0]
                try:
                    floor_s, floor_rows = floor(server, lo, hi, readers, work)
                    total_s, scan_s, report = backfill(server, readers, work / "lake")
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                assert floor_rows == rows == report["rows_written"], (floor_rows, rows, report["rows_written"])
                load_avg = (load_avg + os.getloadavg()[0]) / 2
                f, b, s = rows / floor_s, rows / total_s, rows / scan_s
                print(f"{readers:>7} | {floor_s:>8.1f} {f:>11,.0f} | {total_s:>10.1f} {b:>11,.0f} {b / f:>6.2f} | "
                      f"{scan_s:>7.1f} {s:>11,.0f} {s / f:>6.2f} | {load_avg:>5.1f}", flush=True)
                kept = best.setdefault(readers, [floor_s, total_s, scan_s])
                best[readers] = [min(kept[0], floor_s), min(kept[1], total_s), min(kept[2], scan_s)]
    if args.repeat > 1:
        for readers, (floor_s, total_s, scan_s) in best.items():
            print(f"best of {args.repeat}, {readers} reader(s): floor {floor_s:.1f} s, backfill {total_s:.1f} s, "
                  f"ratio {floor_s / total_s:.2f}, scan ratio {floor_s / scan_s:.2f}")
    print("ratio = rows/s of timelake / rows/s of the floor with as many readers (target: >= 0.85 at 1 reader)")


if __name__ == "__main__":
    main()
