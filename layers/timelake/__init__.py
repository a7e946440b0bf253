"""timelake backfill: load months or years of history into a live Iceberg table, exactly once.

    import timelake
    lake = timelake.connect()
    job = lake.table("iot.sensor").backfill(source="exports/*.parquet", tz="Europe/Berlin")
    job.wait(); print(job.report())
"""

from .errors import BackfillError, InvalidJob, LeaseConflict, TableNotFound, ValidationFailed
from .lake import Job, Lake, Table, connect
from .spec import JobSpec

__version__ = "0.1.0"
__all__ = [
    "BackfillError", "InvalidJob", "Job", "JobSpec", "Lake", "LeaseConflict", "Table", "TableNotFound",
    "ValidationFailed", "connect",
]
