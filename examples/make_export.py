"""Write the example job's export: a historian's Parquet files as `examples/job.json` reads them.

Two tags, one reading an hour, from 1 to 3 December 2024, with the historian's own column names and
naive Europe/Berlin wall-clock time (`timestamp`, `tag_name`, `val`), one file per day, into the
folder given (default `export/`):

    python examples/make_export.py export/
"""

from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DAYS, TAGS = 3, ("d00", "d01")


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(3)
    for day in range(DAYS):
        start = datetime(2024, 12, 1) + timedelta(days=day)
        stamps = [start + timedelta(hours=h) for h in range(24)] * len(TAGS)
        tags = [tag for tag in TAGS for _ in range(24)]
        values = [round(rng.uniform(0, 100), 3) for _ in stamps]
        pq.write_table(pa.table({"timestamp": pa.array(stamps, pa.timestamp("us")), "tag_name": tags, "val": values}),
                       folder / f"{start:%Y-%m-%d}.parquet")
    print(f"wrote {DAYS} files of {24 * len(TAGS)} rows to {folder}/")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "export"))
