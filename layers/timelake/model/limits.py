"""What a backfill may ask of its source: how many scan tasks read it at once and how many rows per
second all of them together read. A database that serves others gets conservative defaults; files
get none. The throttle that applies these limits lives with the sources (`timelake.sources.throttle`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
INFLUX_SCHEME = "influx://"

# Database defaults: a couple of connections and a rate well below what one connection reads
# (bench/bench_postgres.py), so that the source keeps most of its capacity for its own clients.
DATABASE_CONNECTIONS = 2
DATABASE_ROWS_PER_SECOND = 250_000
# Rows one connection reads per second here when nothing limits it, for the dry run's ETA.
ROWS_PER_SECOND_PER_CONNECTION = 1_000_000


@dataclass(frozen=True)
class SourceLimits:
    max_connections: int | None
    rows_per_second: int | None

    def scan_workers(self, wanted: int) -> int:
        return min(wanted, self.max_connections) if self.max_connections else wanted

    def read_seconds(self, rows: int, workers: int) -> float:
        """How long reading ``rows`` takes under these limits (the dry run prints it as the ETA)."""
        rate = self.scan_workers(workers) * ROWS_PER_SECOND_PER_CONNECTION
        if self.rows_per_second:
            rate = min(rate, self.rows_per_second)
        return rows / rate

    def to_json(self, rows: int | None, workers: int) -> dict[str, Any]:
        return {"max_connections": self.max_connections, "rows_per_second": self.rows_per_second,
                "read_eta_seconds": round(self.read_seconds(rows, workers), 1) if rows is not None else None}


def limits(spec: Any) -> SourceLimits:
    """The job's limits; a database that serves others (PostgreSQL, a live InfluxDB) gets
    conservative defaults, files none."""
    database = isinstance(spec.source, str) and spec.source.startswith((*POSTGRES_SCHEMES, INFLUX_SCHEME))
    rate = spec.source_rows_per_second
    return SourceLimits(
        spec.source_max_connections or (DATABASE_CONNECTIONS if database else None),
        (DATABASE_ROWS_PER_SECOND if database else None) if rate is None else (rate or None),  # 0: no limit
    )
