"""Line-protocol export parsing speed: our streamed reader vs pyarrow's CSV reader on the same points.

An InfluxDB export is text like a CSV but with the column names repeated on every line, so pyarrow
reading the same points as CSV (typed C++, multi-threaded and on one thread) is the floor; a scan
task reads one file on one core, several files run in parallel tasks. Prints rows/s and ratios,
also for a file whose every line quotes a string field (split by Arrow kernels, not the one-pass CSV
path), and the rate of the parse alone (lines typed into batches, before the lines of each point are
merged), so the two halves of the time are visible.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from timelake.sources.influx import open_influx_files
from timelake.sources.line_protocol import LineProtocol

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000


def _files(folder: Path, quoted: bool) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    ts = 1_700_000_000_000_000_000 + np.arange(ROWS, dtype=np.int64) * 1_000_000_000
    device = np.char.add("d", (np.arange(ROWS) % 500).astype(str))
    value = np.round(rng.uniform(0, 100, ROWS), 3).astype(str)
    count = (np.arange(ROWS) % 1000).astype(str)
    extra = ',state="a b, c"' if quoted else ""
    lines = np.char.add(np.char.add(np.char.add(np.char.add(np.char.add(np.char.add(
        "sensor,device_id=", device), ",site=north value="), value), ",count="), np.char.add(count, "i" + extra + " ")),
        ts.astype(str))
    lp = folder / f"export-{quoted}.lp"
    lp.write_text("\n".join(lines.tolist()) + "\n")
    table = pa.table({"time": ts, "device_id": device, "site": ["north"] * ROWS, "value": value.astype(float),
                      "count": count.astype(np.int64), **({"state": ["a b, c"] * ROWS} if quoted else {})})
    csv = folder / f"export-{quoted}.csv"
    pcsv.write_csv(table, csv)
    return lp, csv


def _rate(fn: callable) -> float:
    start = time.perf_counter()
    rows = fn()
    assert rows == ROWS, rows
    return ROWS / (time.perf_counter() - start)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for quoted in (False, True):
            lp, csv = _files(Path(tmp), quoted)
            source = open_influx_files(str(lp), "sensor", "ns", 262_144)
            ours = _rate(lambda s=source: sum(b.data.num_rows for b in s.batches()))
            parser = LineProtocol("sensor", "ns", str(lp))
            parse = _rate(lambda p=parser, f=lp: sum(b.num_rows for b in p.batches(pa.OSFile(str(f)))))
            floor = _rate(lambda c=csv: pcsv.read_csv(c).num_rows)
            one = _rate(lambda c=csv: pcsv.read_csv(c, read_options=pcsv.ReadOptions(use_threads=False)).num_rows)
            kind = "every line quotes a string" if quoted else "plain fields"
            print(f"{ROWS:,} points, {kind}: line protocol {ours:,.0f} rows/s; pyarrow CSV {floor:,.0f} rows/s "
                  f"(ratio {ours / floor:.2f}), single-threaded {one:,.0f} rows/s (ratio {ours / one:.2f}); "
                  f"the parse alone {parse:,.0f} rows/s (ratio {parse / floor:.2f} / {parse / one:.2f})")


if __name__ == "__main__":
    main()
