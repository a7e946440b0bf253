"""What a backfill may ask of its source: how many scan tasks read it at once, and how many rows
per second all of them together read.

A migration reads from a system that is still serving (a production database, or its replica):
the backfill must not starve it. The connection bound caps the scan fan-out (reader threads or
processes here, the scan map's MaxConcurrency on AWS). The rate is one budget per job shared by
every worker, wherever it runs, so it lives in the job store: each worker reserves the rows it has just read and
sleeps until the reservation ends (a token bucket without burst, kept as the time at which the
bucket is empty again, so one conditional write per batch is all it costs).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .source import Source, SourceBatch
from .source_influx import is_influx_uri
from .source_postgres import is_postgres

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
    database = is_postgres(spec.source) or is_influx_uri(spec.source)
    rate = spec.source_rows_per_second
    return SourceLimits(
        spec.source_max_connections or (DATABASE_CONNECTIONS if database else None),
        (DATABASE_ROWS_PER_SECOND if database else None) if rate is None else (rate or None),  # 0: no limit
    )


class RateStore(Protocol):
    def reserve_rows(self, job_id: str, rows: int, rows_per_second: float) -> float: ...


@runtime_checkable
class Paced(Protocol):
    """A source that applies the budget itself, between the batches it fetches."""

    def pace(self, take: Any, rows_per_second: int) -> None: ...


class RowBudget:
    """The job's shared rate: ``take(n)`` returns once ``n`` more rows fit into it."""

    def __init__(self, store: RateStore, job_id: str, rows_per_second: int) -> None:
        self.store, self.job_id, self.rows_per_second = store, job_id, rows_per_second

    def take(self, rows: int) -> None:
        wait = self.store.reserve_rows(self.job_id, rows, self.rows_per_second)
        if wait > 0:
            time.sleep(wait)


def budget(store: RateStore, spec: Any, job_id: str) -> RowBudget | None:
    rate = limits(spec).rows_per_second
    return RowBudget(store, job_id, rate) if rate else None


def read(src: Source, pieces: list[str], row_budget: RowBudget | None) -> Iterator[SourceBatch]:
    """The batches of ``pieces``, read within the budget: a paced source waits between its own
    fetches; any other source waits after each batch it yields."""
    own = row_budget is not None and isinstance(src, Paced)
    if own:
        src.pace(row_budget.take, row_budget.rows_per_second)
    for batch in src.read(pieces):
        yield batch
        if row_budget is not None and not own:
            row_budget.take(batch.data.num_rows)
