"""What a backfill may ask of its source: how many scan tasks read it at once, and how many rows
per second all of them together read.

A migration reads from a system that is still serving (a production database, or its replica):
the backfill must not starve it. The connection bound caps the scan fan-out (reader threads or
processes here, the scan map's MaxConcurrency on AWS). The rate is one budget per job shared by
every worker, wherever it runs, so it lives in the job store: each worker reserves the rows it has just read and
sleeps until the reservation ends (a token bucket without burst, kept as the time at which the
bucket is empty again, so one conditional write per batch is all it costs). A rate set on the running
job (`timelake backfill set`) is kept beside the bucket, so the next reservation of every worker goes by
it; a job that started without a limit has no budget to reserve from, and takes a new one from its next
scan task.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from timelake.model.limits import limits
from timelake.ports.clock import Clock
from timelake.sources.base import Source, SourceBatch


class RateStore(Protocol):
    def reserve_rows(self, job_id: str, rows: int, rows_per_second: float, now: float | None = None) -> float: ...


@runtime_checkable
class Paced(Protocol):
    """A source that applies the budget itself, between the batches it fetches."""

    def pace(self, take: Any, rows_per_second: int) -> None: ...


class RowBudget:
    """The job's shared rate: ``take(n)`` returns once ``n`` more rows fit into it."""

    def __init__(self, store: RateStore, job_id: str, rows_per_second: int, clock: Clock) -> None:
        self.store, self.job_id, self.rows_per_second, self.clock = store, job_id, rows_per_second, clock

    def take(self, rows: int) -> None:
        wait = self.store.reserve_rows(self.job_id, rows, self.rows_per_second, self.clock.now())
        if wait > 0:
            self.clock.sleep(wait)


def budget(store: RateStore, spec: Any, job_id: str, clock: Clock) -> RowBudget | None:
    rate = limits(spec).rows_per_second
    return RowBudget(store, job_id, rate, clock) if rate else None


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
