"""Where a job runs: catalog, job store, event bus, alarm sink and staging area, from a small JSON config.

Steps receive a `Runtime` instead of globals so the same step code runs in a writer process, a
Lambda, or the CLI; each of those rebuilds the runtime from `LakeConfig` through the composition
root, `timelake.adapters.runtime_for`, which is the one place that picks the adapters.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import PY_IO_IMPL
from pyiceberg.table import Table as IcebergTable

from timelake.errors import TableNotFound
from timelake.ports.alarms import AlarmSink
from timelake.ports.clock import Clock, SystemClock
from timelake.ports.events import EventBus
from timelake.ports.store import JobStore

DEFAULT_WAREHOUSE = "./.timelake"
SHARED_FILE_IO = "timelake.ports.files.SharedFileIO"
# Another engine on the embedded catalog's file (Spark with Iceberg's JdbcCatalog) holds SQLite's locks
# during its own commits; a commit of ours waits this long for them instead of failing at once with
# "database is locked" (and then retries as after any conflict).
CATALOG_BUSY_SECONDS = 30.0


class LakeConfig(BaseModel):
    catalog_name: str = "timelake"
    catalog_props: dict[str, str] = Field(default_factory=dict)
    store: str = Field(description="sqlite:///path/jobs.db (embedded) or dynamodb://table[?unit_ttl_days=N] (AWS; finished jobs' units expire after N days, default 30)")
    staging: str = Field(description="Root URI for job scratch files (spills, unit manifests)")
    events: str | None = Field(default=None, description="eventbridge://BUS on AWS; None: the in-process bus")
    alarms: str | None = Field(default=None, description="sns://TOPIC_ARN for the live path's real-time alarms; "
                               "None: in-process. Backfills never send to it")
    scan_writes: bool = Field(default=True, description="whether a scan task may write a partition it holds whole as "
                              "its final file (no spill, no write step); False where the scan may not put data files "
                              "(the AWS stack: only the write Lambdas may)")

    @classmethod
    def from_env(cls) -> "LakeConfig":
        """The config a Lambda runs with: ``TIMELAKE_CONFIG`` (this model as JSON) set by the stack."""
        raw = os.environ.get("TIMELAKE_CONFIG")
        if not raw:
            raise RuntimeError("TIMELAKE_CONFIG is not set: it holds the lake config as JSON")
        return cls.model_validate_json(raw)

    @classmethod
    def embedded(cls, warehouse: str | os.PathLike[str] = DEFAULT_WAREHOUSE) -> "LakeConfig":
        root = Path(warehouse).expanduser().resolve()
        private_folder(root)
        for database in ("catalog.db", "jobs.db"):
            private_file(root / database)
        return cls(
            catalog_name="timelake",
            catalog_props={"type": "sql", "uri": f"sqlite:///{root}/catalog.db?timeout={CATALOG_BUSY_SECONDS:g}",
                           "warehouse": f"file://{root}/warehouse"},
            store=f"sqlite:///{root}/jobs.db",
            staging=f"file://{root}/_backfill",
        )


class Runtime:
    """The adapters a step works with. The store and the alarm sink are built on first use: a writer
    process that never touches them opens no database connection and no AWS client. ``clock`` is what
    quiet hours and the source rate wait on (a test sets its own)."""

    def __init__(self, config: LakeConfig, bus: EventBus, store: Callable[[], JobStore],
                 alarms: Callable[[], AlarmSink]) -> None:
        self.config = config
        self.bus = bus
        self._store = store
        self._alarms = alarms
        self.clock: Clock = SystemClock()

    @functools.cached_property
    def alarms(self) -> AlarmSink:
        """The real-time alarm sink; only the live path (`rules.evaluate_live`) uses it."""
        return self._alarms()

    @functools.cached_property
    def catalog(self) -> Catalog:
        """The catalog, with `SharedFileIO` unless the config names its own FileIO."""
        return load_catalog(self.config.catalog_name, **{PY_IO_IMPL: SHARED_FILE_IO, **self.config.catalog_props})

    @functools.cached_property
    def store(self) -> JobStore:
        return self._store()

    def load_table(self, name: str) -> IcebergTable:
        try:
            return self.catalog.load_table(name)
        except NoSuchTableError:
            known = [".".join(t) for ns in self.catalog.list_namespaces() for t in self.catalog.list_tables(ns)]
            raise TableNotFound(f"table '{name}' does not exist (tables: {', '.join(known) or 'none'})") from None

    def staging_path(self, job_id: str, *parts: str) -> str:
        return "/".join([self.config.staging.rstrip("/"), job_id, *parts])


def private_folder(path: Path) -> None:
    """Create ``path`` readable by its owner only (0700): a warehouse holds the data and the job records."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (SQLite gives its -wal and -shm files the same mode)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
