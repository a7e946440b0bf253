"""timelake backfill: load months or years of history into a live Iceberg table, exactly once.

    import timelake
    lake = timelake.connect()
    job = lake.table("iot.sensor").backfill(source="exports/*.parquet", tz="Europe/Berlin")
    job.wait(); print(job.report())
"""

from datetime import datetime

from timelake.errors import (
    Aborted, BackfillError, CatalogUnsupported, DocumentError, DstRefused, FilesLost, Interrupted, InvalidJob, JobBusy,
    JobNotFound, LeaseConflict, MappingError, SourceError, TableNotFound, ValidationFailed,
)
from timelake.interfaces.lake import Job, Lake, Table, connect
from timelake.model.spec import JobSpec
from timelake.model.version import __version__


def is_range_leased(table: str, start: "str | datetime", end: "str | datetime", warehouse: str | None = None) -> bool:
    """True while an unpublished backfill holds part of [start, end) of ``table`` (see `Lake.is_range_leased`)."""
    return connect(warehouse=warehouse).is_range_leased(table, start, end)


__all__ = [
    "Aborted", "BackfillError", "CatalogUnsupported", "DocumentError", "DstRefused", "FilesLost", "Interrupted",
    "InvalidJob", "Job", "JobBusy", "JobNotFound", "JobSpec", "Lake", "LeaseConflict", "MappingError", "SourceError",
    "Table", "TableNotFound", "ValidationFailed", "__version__", "connect", "is_range_leased",
]
