"""Messy CSV exports: our reader and mapping vs DuckDB's read_csv on the same file with the same options.

What a scan task does with a CSV file, timed alone (no partitioning, spill or write): the file read
a batch at a time (series keys as dictionaries, as the scan asks for them) and every batch mapped
onto the table (times parsed and localized, numbers converted, bad values counted). DuckDB reads the
same file into Arrow with the same options, all its threads, which is the floor a user would compare
with. Three exports:

- ``german``: ';', decimal comma, dotted day-first local times (Europe/Berlin), 'n/a' cells, long;
- ``pi``: 12-hour times, a third of the values written "1,234.5" (quoted), 3 % digital states kept
  as text (``--thousands , --states-column``; DuckDB: ``thousands=','`` into text, then TRY_CAST);
- ``wide``: Excel's semicolon CSV of 100 tags, one column each, blanks; unpivoted (DuckDB: UNPIVOT).

Each side runs in a fresh process, alternately, ``--repeat`` times; the best run of each is compared
(the machine is shared: the load average is printed), and the ratio is printed against the 1.5 target.

    .venv/bin/python bench/bench_csv.py                   # 2M values per file, 5 rounds
    .venv/bin/python bench/bench_csv.py --rows 500000 --repeat 3 --only pi
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

TARGET = 1.5
TAGS = 100
SHAPES = {
    "german": {"options": {"delimiter": ";", "decimal": ",", "tz": "Europe/Berlin"},
               "map": {"ts": "Zeitstempel", "tag": "Messstelle", "value": "Messwert"}},
    "pi": {"options": {"timestamp_format": "%m/%d/%Y %I:%M:%S %p", "thousands": ",", "tz": "America/New_York",
                       "states_column": "state"},
           "map": {"ts": "Timestamp", "tag": "Tag", "value": "Value"}},
    "wide": {"options": {"delimiter": ";", "decimal": ",", "tz": "Europe/Berlin", "wide": True},
             "map": {"ts": "Zeitstempel"}},
}


def write(shape: str, path: Path, rows: int) -> None:
    rng = np.random.default_rng(1)
    steps = rows // 50 if shape != "wide" else rows // TAGS
    times = pd.date_range("2026-03-20", periods=steps, freq="10s", tz="Europe/Berlin")
    if shape == "wide":
        stamps = times.strftime("%d.%m.%Y %H:%M:%S")
        values = np.char.replace(np.round(rng.uniform(-100, 900, (steps, TAGS)), 2).astype(str), ".", ",")
        values[rng.random((steps, TAGS)) < 0.05] = ""
        body = np.column_stack([stamps, values])
        header = "Zeitstempel;" + ";".join(f"TI-{i:03d}" for i in range(TAGS))
        path.write_text(header + "\n" + "\n".join(";".join(r) for r in body) + "\n")
        return
    stamps = np.repeat(np.asarray(times.tz_convert("America/New_York").strftime("%-m/%-d/%Y %-I:%M:%S %p")
                                  if shape == "pi" else times.strftime("%d.%m.%Y %H:%M:%S")), 50)
    tags = np.tile(np.array([f"S{i:03d}" for i in range(50)]), steps)
    numbers = np.round(rng.uniform(-100, 5000, len(tags)), 1)
    roll = rng.random(len(tags))
    if shape == "pi":
        plain = numbers.astype(str)
        grouped = np.array([f'"{v:,.1f}"' for v in numbers])
        values = np.where(roll < 0.03, "I/O Timeout", np.where(roll < 0.36, grouped, plain))
        lines = np.char.add(np.char.add(np.char.add(np.char.add(tags, ","), stamps), ","), values)
        path.write_text("Tag,Timestamp,Value\n" + "\n".join(lines) + "\n")  # the grouped values carry their quotes
    else:
        values = np.where(roll < 0.001, "n/a", np.char.replace(numbers.astype(str), ".", ","))
        pd.DataFrame({"Zeitstempel": stamps, "Messstelle": tags, "Messwert": values}).to_csv(path, sep=";", index=False)


def duckdb_query(shape: str, path: Path) -> str:
    if shape == "german":
        return (f"SELECT * FROM read_csv('{path}', delim=';', decimal_separator=',', header=true, nullstr=['n/a', ''], "
                "timestampformat='%d.%m.%Y %H:%M:%S', columns={'Zeitstempel': 'TIMESTAMP', 'Messstelle': 'VARCHAR', "
                "'Messwert': 'DOUBLE'})")
    if shape == "pi":
        return (f"SELECT Tag, Timestamp, TRY_CAST(replace(Value, ',', '') AS DOUBLE) AS value, "
                "CASE WHEN TRY_CAST(replace(Value, ',', '') AS DOUBLE) IS NULL THEN Value END AS state "
                f"FROM read_csv('{path}', header=true, timestampformat='%m/%d/%Y %I:%M:%S %p', "
                "columns={'Tag': 'VARCHAR', 'Timestamp': 'TIMESTAMP', 'Value': 'VARCHAR'})")
    columns = ", ".join(f"'TI-{i:03d}': 'DOUBLE'" for i in range(TAGS))
    return (f"UNPIVOT (SELECT * FROM read_csv('{path}', delim=';', decimal_separator=',', header=true, "
            f"timestampformat='%d.%m.%Y %H:%M:%S', columns={{'Zeitstempel': 'TIMESTAMP', {columns}}})) "
            "ON COLUMNS(* EXCLUDE (Zeitstempel)) INTO NAME tag VALUE value")


def run_duckdb(shape: str, path: Path) -> dict:
    import duckdb

    started, cpu = time.perf_counter(), time.process_time()
    rows = duckdb.connect().sql(duckdb_query(shape, path)).to_arrow_table().num_rows
    return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu, "rows": rows}


def run_ours(shape: str, path: Path) -> dict:
    import pyarrow as pa

    from timelake.model.spec import JobSpec
    from timelake.sources.base import CsvOptions, open_source
    from timelake.sources.mapping import Mapper
    from timelake.sources.wide import WideSource

    setup = SHAPES[shape]
    spec = JobSpec(table="bench.csv", source=str(path), map=setup["map"], on_bad_value="reject", **setup["options"])
    target = pa.schema([pa.field("ts", pa.timestamp("us", "UTC"), False), ("tag", pa.string()), ("value", pa.float64()),
                        ("state", pa.string())])
    started, cpu = time.perf_counter(), time.process_time()
    src = open_source(str(path), csv=CsvOptions(delimiter=spec.delimiter, null_values=tuple(spec.null_values)))
    if spec.wide:
        src = WideSource(src, "Zeitstempel", [], ["tag"], "value")
    src.read_dictionaries({spec.map.get("tag", "tag")})  # the scan asks for the series key coded
    mapper = Mapper(target, src.schema(), time_column="ts", series_key=["tag"], column_map=spec.map, tz=spec.tz,
                    dst_policy="infer", on_bad_value="reject", decimal=spec.decimal, thousands=spec.thousands,
                    timestamp_format=spec.timestamp_format, states_column=spec.states_column, keep_dictionary=("tag",))
    rows = rejected = 0
    for batch in src.batches():
        mapped = mapper.apply(batch)
        rows += mapped.table.num_rows
        rejected += sum(mapped.rejected.values())
    return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu, "rows": rows, "rejected": rejected}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--side", nargs=3, help=argparse.SUPPRESS)  # internal: shape, path, side
    args = parser.parse_args()
    if args.side:
        shape, path, side = args.side
        print(json.dumps((run_ours if side == "ours" else run_duckdb)(shape, Path(path))))
        return
    with tempfile.TemporaryDirectory(prefix="bench-csv-") as folder:
        for shape in args.only:
            path = Path(folder) / f"{shape}.csv"
            write(shape, path, args.rows)
            best: dict[str, dict] = {}
            for _ in range(args.repeat):
                for side in ("duckdb", "ours"):
                    out = subprocess.run([sys.executable, __file__, "--side", shape, str(path), side], check=True,
                                         capture_output=True, text=True).stdout
                    result = json.loads(out)
                    if side not in best or result["seconds"] < best[side]["seconds"]:
                        best[side] = result
            ours, duck = best["ours"], best["duckdb"]
            ratio = ours["seconds"] / duck["seconds"]
            print(f"{shape:>6}: {path.stat().st_size / 1e6:.0f} MB, {duck['rows']:,} rows; duckdb {duck['seconds']:.3f} s "
                  f"(cpu {duck['cpu']:.2f}), ours {ours['seconds']:.3f} s (cpu {ours['cpu']:.2f}, {ours['rows']:,} rows, "
                  f"{ours['rejected']:,} rejected); ratio {ratio:.2f} (target <= {TARGET}) "
                  f"{'ok' if ratio <= TARGET else 'OVER'}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
