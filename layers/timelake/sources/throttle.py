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
from typing import Any, Protocol, runtime_checkable

from timelake.model.limits import limits
from timelake.sources.base import Source, SourceBatch


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
