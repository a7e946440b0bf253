"""Line-protocol export parsing speed: our streamed reader vs pyarrow's CSV reader on the same points.

An InfluxDB export is text like a CSV but with the column names repeated on every line, so pyarrow
reading the same points as CSV (typed C++, multi-threaded and on one thread) is the floor; a scan
task reads one file, several files run in parallel tasks. Prints rows/s and ratios, also for a
file whose every line quotes a string field, for an export as ``influx_inspect`` writes it (one
line per field, in runs per series and field, so every point is merged from its lines), the same
with what real ones hold (a tenth of the values missing, and the series listed again for a second
shard of time), and the rate of the parse alone (lines typed into batches, before the merge).
``--only wide`` reads the same number of fields as lines of 10 fields and as lines of 2,000 (each
its own key), with the compiled reader and with the Arrow one, and prints the time per field of each:
the target is 2,000 fields a line in at most twice the time per field of 10.

The sides run alternately, ``--repeat`` times; the best run of each is compared (the machine is
shared, so the load average is printed with them, and the ratio of CPU seconds, which load moves less).
They run in a fresh process per file, as a backfill does: the process that wrote the files has had
hundreds of MB allocated and freed, which leaves the C allocator's thresholds raised, and a reader
in that process was about 15 % faster than in a new one.

    .venv/bin/python bench/bench_influx_lp.py                # 2M points, 5 rounds
    .venv/bin/python bench/bench_influx_lp.py 1000000 --repeat 9
    .venv/bin/python bench/bench_influx_lp.py --only wide --fields 2000000
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
from timelake.sources.influx import open_influx_files
from timelake.sources.line_protocol import LineProtocol

FILES = {"plain": "plain fields", "quoted": "every line quotes a string", "tsm": "one line per field (TSM export)",
         "gaps": "TSM export, a tenth of the values missing, two shards"}
WIDTHS = (10, 2_000)  # fields per line of the wide case


def _files(folder: Path, rows: int, kind: str) -> tuple[Path, Path, int]:
    """The export, the same points as CSV, and how many points there are."""
    rng = np.random.default_rng(0)
    ts = 1_700_000_000_000_000_000 + np.arange(rows, dtype=np.int64) * 1_000_000_000
    device = np.char.add("d", (np.arange(rows) % 500).astype(str))
    value = np.round(rng.uniform(0, 100, rows), 3).astype(str)
    count = (np.arange(rows) % 1000).astype(str)
    series = np.char.add(np.char.add("sensor,device_id=", device), ",site=north ")
    stamp = np.char.add(" ", ts.astype(str))
    if kind == "gaps":
        return _gaps(folder, ts, device, series, stamp, value, count, rng)
    if kind == "tsm":  # per series, a run of lines per field, each in time order: a point's lines are a run apart
        order = np.argsort(np.arange(rows) % 500, kind="stable")
        runs = [np.char.add(np.char.add(np.char.add(series, f"{name}="), text), stamp)[order].reshape(500, -1)
                for name, text in (("value", value), ("count", np.char.add(count, "i")))]
        lines = np.stack(runs, axis=1).reshape(-1)
    else:
        extra = ',state="a b, c"' if kind == "quoted" else ""
        lines = np.char.add(np.char.add(np.char.add(np.char.add(series, "value="), value),
                                        np.char.add(np.char.add(",count=", count), "i" + extra)), stamp)
    lp = folder / f"export-{kind}.lp"
    lp.write_text("\n".join(lines.tolist()) + "\n")
    table = pa.table({"time": ts, "device_id": device, "site": ["north"] * rows, "value": value.astype(float),
                      "count": count.astype(np.int64), **({"state": ["a b, c"] * rows} if kind == "quoted" else {})})
    csv = folder / f"export-{kind}.csv"
    pcsv.write_csv(table, csv)
    return lp, csv, rows


def _gaps(folder: Path, ts: np.ndarray, device: np.ndarray, series: np.ndarray, stamp: np.ndarray, value: np.ndarray,
          count: np.ndarray, rng: np.random.Generator) -> tuple[Path, Path, int]:
    """Per shard (the first and second half of the time), per series, per field a run of lines, a tenth
    of each field's values missing; a point whose values are all missing is not in the file."""
    rows = len(ts)
    kept = rng.uniform(size=(2, rows)) > 0.1
    point = kept.any(axis=0)
    shard = (np.arange(rows) // 500 >= rows // 1000).astype(np.int64)  # a series' points: the first half, then the rest
    device_number = np.arange(rows) % 500
    texts = [np.char.add(np.char.add(np.char.add(series, f"{name}="), text), stamp)
             for name, text in (("value", value), ("count", np.char.add(count, "i")))]
    field = np.repeat([0, 1], rows)
    keep = np.concatenate(kept)
    order = np.lexsort((np.tile(ts, 2), field, np.tile(device_number, 2), np.tile(shard, 2)))
    order = order[keep[order]]
    lp = folder / "export-gaps.lp"
    lp.write_text("\n".join(np.concatenate(texts)[order].tolist()) + "\n")
    table = pa.table({"time": ts, "device_id": device, "site": ["north"] * rows,
                      "value": pa.array(value.astype(float), mask=~kept[0]),
                      "count": pa.array(count.astype(np.int64), mask=~kept[1])}).filter(pa.array(point))
    csv = folder / "export-gaps.csv"
    pcsv.write_csv(table, csv)
    return lp, csv, int(point.sum())


def _seconds(fn: Callable[[], int], rows: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds (every thread of this process) of one run."""
    start, cpu = time.perf_counter(), time.process_time()
    got = fn()
    assert got == rows, got
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", type=int, nargs="?", default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=[*FILES, "wide"], default=list(FILES))
    parser.add_argument("--fields", type=int, default=2_000_000, help="fields of each file of the wide case")
    args = parser.parse_args()
    rows = args.rows - args.rows % 500
    print(f"{os.cpu_count()} CPUs, pyarrow {pa.__version__}, {rows:,} points, best of {args.repeat} alternating runs")
    with tempfile.TemporaryDirectory() as tmp:
        if "wide" in args.only:
            paths = [_wide(Path(tmp), args.fields, width) for width in WIDTHS]
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
                fresh.submit(_measure_wide, paths, args.fields, args.repeat).result()
        for kind in (kind for kind in args.only if kind != "wide"):
            lp, csv, points = _files(Path(tmp), rows, kind)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
                fresh.submit(_measure, kind, lp, csv, points, args.repeat).result()


def _wide(folder: Path, fields: int, width: int) -> Path:
    """``fields`` values as lines of ``width`` fields, keys f0, f1, ... (50 series, rising times)."""
    rng = np.random.default_rng(0)
    lines = fields // width
    values = np.round(rng.uniform(0, 100, (lines, width)), 3).astype(str)
    pairs = np.char.add(np.array([f"f{i}=" for i in range(width)]), values)
    body = [f"sensor,device_id=d{n % 50} {','.join(row)} {1_700_000_000_000_000_000 + n}" for n, row in enumerate(pairs)]
    path = folder / f"wide-{width}.lp"
    path.write_text("\n".join(body) + "\n")
    return path


def _measure_wide(paths: list[Path], fields: int, repeat: int) -> None:
    """CPU time per field of each width, compiled and Arrow reader, alternating; the best run of each."""
    from timelake.sources import line_protocol

    compiled = line_protocol._lineproto
    cpu: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeat):
        for reader in ("compiled", "arrow"):
            line_protocol._lineproto = compiled if reader == "compiled" else None
            for path, width in zip(paths, WIDTHS, strict=True):
                source = open_influx_files(str(path), "sensor", "ns", 262_144)
                _, used = _seconds(lambda s=source: sum(b.data.num_rows for b in s.batches()), fields // width)
                cpu.setdefault((reader, width), []).append(used)
    line_protocol._lineproto = compiled
    for reader in ("compiled", "arrow"):
        per_field = {width: min(cpu[(reader, width)]) / fields * 1e9 for width in WIDTHS}
        print(f"{fields:,} fields, {reader} reader (load average {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{width} a line {per_field[width]:.0f} ns of CPU per field" for width in WIDTHS)
              + f"; ratio {per_field[WIDTHS[-1]] / per_field[WIDTHS[0]]:.2f} (target <= 2)", flush=True)


def _parse(lp: Path) -> int:
    """Rows of the lines typed into batches, read through a memory map as a backfill reads a local file."""
    with lp.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return sum(b.num_rows for b in LineProtocol("sensor", "ns", str(lp)).batches(mapped))


def _measure(kind: str, lp: Path, csv: Path, points: int, repeat: int) -> None:
    """Both readers on one file, alternating, in this (new) process; prints the rates and ratios."""
    sides: dict[str, Callable[[], int]] = {
        "ours": lambda f=lp: sum(b.data.num_rows for b in open_influx_files(str(f), "sensor", "ns", 262_144).batches()),
        "csv": lambda c=csv: pcsv.read_csv(c).num_rows,
        "csv 1 thread": lambda c=csv: pcsv.read_csv(c, read_options=pcsv.ReadOptions(use_threads=False)).num_rows,
    }
    if kind in ("plain", "quoted"):  # the parse alone: one line per point, so as many rows as points
        sides["parse"] = lambda f=lp: _parse(f)
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    load = os.getloadavg()[0]
    for _ in range(repeat):
        for side, fn in sides.items():
            wall, used = _seconds(fn, points)
            times[side].append(wall)
            cpu[side].append(used)
    load = (load + os.getloadavg()[0]) / 2
    best = {side: points / min(t) for side, t in times.items()}
    median = {side: points / statistics.median(t) for side, t in times.items()}
    least = {side: min(t) for side, t in cpu.items()}
    print(f"{FILES[kind]} (load average {load:.1f}): line protocol {best['ours']:,.0f} rows/s; pyarrow CSV "
          f"{best['csv']:,.0f} rows/s (ratio {best['ours'] / best['csv']:.2f}, medians "
          f"{median['ours'] / median['csv']:.2f}, CPU seconds {least['csv'] / least['ours']:.2f}), one thread "
          f"{best['csv 1 thread']:,.0f} rows/s (ratio {best['ours'] / best['csv 1 thread']:.2f})"
          + (f"; the parse alone {best['parse']:,.0f} rows/s (ratio {best['parse'] / best['csv']:.2f})"
             if "parse" in best else ""), flush=True)


if __name__ == "__main__":
    main()
