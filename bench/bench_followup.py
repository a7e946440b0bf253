"""After publish, against DuckDB: the refreshing phase (hourly and daily rollups, rules evaluated in
historical mode) beside DuckDB computing the same rollups and rule episodes in plain SQL over the same
rows.

Not a test: it prints times (wall and CPU seconds of this process: both sides run in it, so the CPU
seconds hold still on a shared machine where wall times do not) and the ratio beside its target
(<= 1.5), and checks that both sides computed the same rollup rows and events.

    .venv/bin/python bench/bench_followup.py                 # 200 devices x 30 days at 1/min = 8.64M rows
    .venv/bin/python bench/bench_followup.py --devices 50
    .venv/bin/python bench/bench_followup.py --repeat 3     # best of 3 rounds, for a busy machine

Ours: a backfill is published, then `followup.run` (what the embedded runner's refreshing phase runs)
is timed alone: it reads the published range back from the table, recomputes both rollups per chunk
and swaps them in, evaluates the rules and records their events. DuckDB: the same aggregates and the
same rule episodes (a run of consecutive matching samples per series fires once, at its first sample
at least the rule's duration after the run began) over the same rows, read from Parquet files: once
asking only for the counts (DuckDB may then skip aggregates nobody reads), once keeping the results
in memory tables (nothing written back), which are then compared with our rollup tables and events.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers"))

import timelake  # noqa: E402
from timelake.followup import refresh  # noqa: E402
from timelake.runner import run_job  # noqa: E402

SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
RULES = ["hot: value > 80 for PT20M severity critical", "cold: value < 4"]
ROLLUPS = [{"interval": "1h", "columns": ["value"]}, {"interval": "1d", "columns": ["value"]}]

T = TypeVar("T")
RUNS = """
WITH marked AS (
    SELECT device_id, ts, value, value > 80 AS hot, value < 4 AS cold FROM base),
runs AS (
    SELECT *, sum(CASE WHEN hot THEN 0 ELSE 1 END) OVER w AS hot_run, sum(CASE WHEN cold THEN 0 ELSE 1 END) OVER w AS cold_run
    FROM marked WINDOW w AS (PARTITION BY device_id ORDER BY ts)),
hot AS (
    SELECT device_id, hot_run, min(ts) AS started FROM runs WHERE hot GROUP BY ALL),
hot_events AS (
    SELECT 'hot' AS rule, r.device_id, h.started, min(r.ts) AS fired, arg_min(r.value, r.ts) AS value
    FROM runs r JOIN hot h USING (device_id, hot_run)
    WHERE r.hot AND r.ts - h.started >= INTERVAL 20 MINUTE GROUP BY ALL),
cold_events AS (
    SELECT 'cold' AS rule, device_id, min(ts) AS started, min(ts) AS fired, arg_min(value, ts) AS value
    FROM runs WHERE cold GROUP BY device_id, cold_run)"""


def rollup_sql(width: str) -> str:
    return (f"SELECT device_id, time_bucket(INTERVAL 1 {width}, ts) AS bucket_start, count(*) AS rows, min(value) AS value_min, "
            "max(value) AS value_max, sum(value) AS value_sum, avg(value) AS value_avg FROM base GROUP BY ALL")


# The results, materialised: what "computing the same rollups and rule episodes" means
DUCKDB_TABLES = [f"CREATE OR REPLACE TEMP TABLE rollup_1h AS {rollup_sql('HOUR')}",
                 f"CREATE OR REPLACE TEMP TABLE rollup_1d AS {rollup_sql('DAY')}",
                 f"CREATE OR REPLACE TEMP TABLE events AS {RUNS} SELECT * FROM hot_events UNION ALL SELECT * FROM cold_events"]
# Only the counts: DuckDB may then skip the aggregates nobody reads, so this floor is the lower one
DUCKDB_COUNTS = f"""{RUNS}, rollup_1h AS ({rollup_sql('HOUR')}), rollup_1d AS ({rollup_sql('DAY')})
SELECT (SELECT count(*) FROM rollup_1h) + (SELECT count(*) FROM rollup_1d), (SELECT count(*) FROM hot_events) + (SELECT count(*) FROM cold_events)"""


def compare(lake: timelake.Lake, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Our rollup tables and backfill events against DuckDB's: the differences, none when equal
    (counts, minima and maxima exactly; sums and averages to 1e-9, as the order of a float sum differs)."""
    problems = []
    for interval in ("1h", "1d"):
        con.register("ours", lake.catalog.load_table(f"bench.sensor_{interval}").scan().to_arrow())
        diff = con.sql(f"""SELECT count(*) FROM ours FULL JOIN rollup_{interval} d USING (device_id, bucket_start)
            WHERE ours.rows IS DISTINCT FROM d.rows OR ours.value_min IS DISTINCT FROM d.value_min
               OR ours.value_max IS DISTINCT FROM d.value_max OR abs(ours.value_sum - d.value_sum) > 1e-9 * abs(d.value_sum)
               OR abs(ours.value_avg - d.value_avg) > 1e-9 * abs(d.value_avg) OR ours.value_sum IS NULL""").fetchall()[0][0]
        if diff:
            problems.append(f"rollup {interval}: {diff:,} buckets differ")
    con.register("ours", lake.table("bench.sensor").events().select(["rule", "device_id", "started_at", "fired_at", "value"]))
    diff = con.sql("""SELECT count(*) FROM (
        (SELECT * FROM ours EXCEPT ALL SELECT * FROM events) UNION ALL (SELECT * FROM events EXCEPT ALL SELECT * FROM ours))""").fetchall()[0][0]
    if diff:
        problems.append(f"events: {diff:,} differ")
    return problems


def write_source(folder: Path, devices: int, days: int) -> tuple[str, str]:
    """A file per day; values wander so that rules fire now and then. Returns the range [start, end)."""
    first = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=days + 3)
    names = np.repeat(np.array([f"dev-{i:04d}" for i in range(devices)]), 1440)
    rng = np.random.default_rng(7)
    for day in range(days):
        start = np.datetime64((first + timedelta(days=day)).replace(tzinfo=None), "us")
        ts = np.tile(start + np.arange(1440) * np.timedelta64(60, "s"), devices)
        walk = np.cumsum(rng.normal(0, 3, (devices, 1440)), axis=1).ravel()
        value = np.clip(40 + walk, 0, 100).round(2)
        pq.write_table(pa.table({"ts": pa.array(ts).cast(SCHEMA.field("ts").type), "device_id": names, "value": value},
                                schema=SCHEMA), folder / f"day-{day:03d}.parquet")
    return first.isoformat(), (first + timedelta(days=days)).isoformat()


def clocked(run: Callable[[], T]) -> tuple[T, float, float]:
    """``run()``, its wall seconds and the CPU seconds of this process meanwhile (every thread's)."""
    started, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the three timed runs; the best of each is shown")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-followup-") as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        write_source(source, args.devices, args.days)
        lake = timelake.connect(warehouse=Path(tmp) / "lake")
        lake.create_table("bench.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                          partition_by="day", rollups=ROLLUPS, rules=RULES)
        job_id = lake.create_job(timelake.JobSpec(table="bench.sensor", source=f"{source}/*.parquet", evaluate_rules=True)).id
        rt = lake.runtime
        started = time.perf_counter()
        run_job(rt, job_id)  # its refreshing phase builds the rollups and events once ...
        total = time.perf_counter() - started
        job = rt.store.get_job(job_id)
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"CREATE VIEW base AS SELECT * FROM read_parquet('{source}/*.parquet')")
        times: dict[str, list[tuple[float, float]]] = {"ours": [], "counts": [], "results": []}
        for _ in range(args.repeat):  # round-robin, so a busy minute of the machine weighs on all three
            rt.store.update_job(job_id, "refreshing")  # ... and each timed run recomputes and replaces them all
            done, *clock = clocked(lambda: refresh.run(rt, job_id))
            times["ours"].append(tuple(clock))
            counts, *clock = clocked(lambda: con.sql(DUCKDB_COUNTS).fetchall()[0])
            times["counts"].append(tuple(clock))
            _, *clock = clocked(lambda: [con.execute(statement) for statement in DUCKDB_TABLES])
            times["results"].append(tuple(clock))
        problems = compare(lake, con)
    best = {name: (min(w for w, _ in runs), min(c for _, c in runs)) for name, runs in times.items()}
    rows = job.state["rows_in_source"]
    print(f"{rows:,} rows ({args.devices} devices x {args.days} days at 1/min); whole job {total:.1f} s; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; best of {args.repeat}")
    print(f"ours   refreshing phase        {best['ours'][0]:6.2f} s ({best['ours'][1]:5.2f} CPU s)  "
          f"rollup rows {sum(done['rollups'].values()):,}  events {done.get('events', 0):,}")
    print(f"duckdb same SQL, counts only   {best['counts'][0]:6.2f} s ({best['counts'][1]:5.2f} CPU s)  "
          f"rollup rows {counts[0]:,}  events {counts[1]:,}")
    print(f"duckdb same SQL, results kept  {best['results'][0]:6.2f} s ({best['results'][1]:5.2f} CPU s)")
    print(f"ours / duckdb: {best['ours'][0] / best['counts'][0]:.2f} against the counts, "
          f"{best['ours'][0] / best['results'][0]:.2f} against the results (target <= 1.5); in CPU seconds "
          f"{best['ours'][1] / best['counts'][1]:.2f} and {best['ours'][1] / best['results'][1]:.2f}")
    print("results: " + ("; ".join(problems) if problems else "ours equal DuckDB's (rollups and events)"))


if __name__ == "__main__":
    main()
