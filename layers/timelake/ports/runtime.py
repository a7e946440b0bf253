"""Where a job runs: catalog, object IO, job store, event bus, alarm sink and staging area, from a small JSON config.

Steps receive a `Runtime` instead of globals so the same step code runs in a writer process, a
Lambda, or the CLI; each of those rebuilds the runtime from `LakeConfig` through the composition
root, `timelake.adapters.runtime_for`, which is the one place that picks the adapters.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table as IcebergTable
from pyiceberg.utils.config import Config

from timelake.errors import CatalogUnsupported, TableNotFound
from timelake.ports.alarms import AlarmSink
from timelake.ports.clock import Clock
from timelake.ports.events import EventBus
from timelake.ports.files import ObjectIO
from timelake.ports.store import JobStore

DEFAULT_WAREHOUSE = "./.timelake"
# Another engine on the embedded catalog's file (Spark with Iceberg's JdbcCatalog) holds SQLite's locks
# during its own commits; a commit of ours waits this long for them instead of failing at once with
# "database is locked" (and then retries as after any conflict).
CATALOG_BUSY_SECONDS = 30.0
# pyiceberg (0.12) catalogs a backfill cannot run on, by class, and why: refused in one line before a
# job starts instead of failing at its first commit, after the writing.
CANNOT_BACKFILL = {
    "DynamoDbCatalog": "pyiceberg's DynamoDB catalog cannot commit to a table (commit_table is not implemented)",
    "BigQueryMetastoreCatalog": "pyiceberg's BigQuery metastore catalog cannot commit to a table (commit_table is not implemented)",
    "InMemoryCatalog": "an in-memory catalog lives in one process: the job's writers, a resume and other engines cannot see it",
    "NoopCatalog": "a no-op catalog holds no tables",
}


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
    def from_env(cls) -> LakeConfig:
        """The config a Lambda runs with: ``TIMELAKE_CONFIG`` (this model as JSON) set by the stack."""
        raw = os.environ.get("TIMELAKE_CONFIG")
        if not raw:
            raise RuntimeError("TIMELAKE_CONFIG is not set: it holds the lake config as JSON")
        return cls.model_validate_json(raw)

    @classmethod
    def named(cls, catalog: str, warehouse: str | os.PathLike[str] = DEFAULT_WAREHOUSE, store: str | None = None,
              staging: str | None = None, props: dict[str, str] | None = None) -> LakeConfig:
        """A pyiceberg catalog chosen by name, as pyiceberg's own ``load_catalog(catalog)`` finds it
        (`catalog_properties`, overridden by ``props``); the job store and the staging area stay in
        the local ``warehouse`` folder, as in the embedded lake. The properties are resolved here,
        once, so that writer processes and a resume use the catalog this config was made with."""
        found = {**catalog_properties(catalog, required=not props), **(props or {})}
        local_store, local_staging = local_state(warehouse)
        return cls(catalog_name=catalog, catalog_props=found, store=store or local_store, staging=staging or local_staging)

    @classmethod
    def embedded(cls, warehouse: str | os.PathLike[str] = DEFAULT_WAREHOUSE) -> LakeConfig:
        store, staging = local_state(warehouse)
        root = Path(warehouse).expanduser().resolve()
        private_file(root / "catalog.db")
        return cls(
            catalog_name="timelake",
            catalog_props={"type": "sql", "uri": f"sqlite:///{root}/catalog.db?timeout={CATALOG_BUSY_SECONDS:g}",
                           "warehouse": f"file://{root}/warehouse"},
            store=store,
            staging=staging,
        )


def local_state(warehouse: str | os.PathLike[str] = DEFAULT_WAREHOUSE) -> tuple[str, str]:
    """The job store and the staging root in a local warehouse folder, created private (0700/0600)."""
    root = Path(warehouse).expanduser().resolve()
    private_folder(root)
    private_file(root / "jobs.db")
    return f"sqlite:///{root}/jobs.db", f"file://{root}/_backfill"


T = TypeVar("T")


class built_once(Generic[T]):  # noqa: N801 - used as a decorator, like functools.cached_property
    """`functools.cached_property` that builds its value once per instance even when threads ask at the
    same time (two jobs submitted on threads of one process share a runtime): since Python 3.12 the
    standard one takes no lock, and a catalog or job store built twice holds two connection pools."""

    def __init__(self, build: Callable[[Any], T]) -> None:
        self.build, self.name, self.lock = build, build.__name__, threading.Lock()
        self.__doc__ = build.__doc__

    def __get__(self, instance: Any, owner: type | None = None) -> T:
        if instance is None:
            return self  # type: ignore[return-value]
        found = instance.__dict__.get(self.name, _MISSING)
        if found is _MISSING:
            with self.lock:
                found = instance.__dict__.get(self.name, _MISSING)
                if found is _MISSING:
                    found = instance.__dict__[self.name] = self.build(instance)
        return found


_MISSING = object()


class Runtime:
    """The adapters a step works with, as the composition root (`timelake.adapters.compose`) picked them.
    The catalog, the store and the alarm sink are built on first use: a writer process that never
    touches them opens no catalog or database connection and no AWS client. ``objects`` opens files
    and objects by location; ``clock`` is what quiet hours and the source rate wait on (a test sets
    its own)."""

    def __init__(self, config: LakeConfig, bus: EventBus, store: Callable[[], JobStore],
                 alarms: Callable[[], AlarmSink], catalog: Callable[[], Catalog], objects: ObjectIO,
                 clock: Clock) -> None:
        self.config = config
        self.bus = bus
        self._store = store
        self._alarms = alarms
        self._catalog = catalog
        self.objects = objects
        self.clock = clock

    @built_once
    def alarms(self) -> AlarmSink:
        """The real-time alarm sink; only the live path (`rules.evaluate_live`) uses it."""
        return self._alarms()

    @built_once
    def catalog(self) -> Catalog:
        """The catalog the config names (`timelake.adapters.catalog`)."""
        return self._catalog()

    def check_catalog(self, name: str | None) -> None:
        """A job that names its catalog runs only on that catalog: a resume, the AWS stack or a DuckDB
        session on another one would look for its table, branch and files in the wrong place."""
        if name is not None and name != self.config.catalog_name:
            raise CatalogUnsupported(f"the job is for catalog '{name}', but this runs on catalog '{self.config.catalog_name}'"
                                     f"{'' if self.config.catalog_name != 'timelake' else ' (the embedded lake)'}: "
                                     f"use --catalog {name} (TIMELAKE_CATALOG, timelake.connect(catalog=...))")

    def require_commits(self) -> None:
        """Refuse, before any work, a catalog that cannot do what a backfill does (`CANNOT_BACKFILL`)."""
        reason = CANNOT_BACKFILL.get(type(self.catalog).__name__)
        if reason:
            kind = self.config.catalog_props.get("type", type(self.catalog).__name__)
            raise CatalogUnsupported(f"catalog '{self.config.catalog_name}' ({kind}) cannot run a backfill: {reason}; "
                                     "use a sql, rest, glue or hive catalog")

    @built_once
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


def catalog_properties(name: str, required: bool = True, of: str = "") -> dict[str, str]:
    """The properties pyiceberg's own ``load_catalog(name)`` reads for a catalog: its entry under
    ``catalog:`` in ``.pyiceberg.yaml`` (in $PYICEBERG_HOME, the home folder or the working folder)
    merged with ``PYICEBERG_CATALOG__<NAME>__<PROPERTY>`` variables, read now rather than when
    pyiceberg was imported, so a catalog defined later is found. Values become strings, as
    pyiceberg's properties are; a nested mapping becomes dotted keys. ``of`` says what the catalog is
    for, in the error (`` of source 'iceberg://...'``)."""
    found = Config().get_catalog_config(name)
    if not found and required:
        variable = name.upper().replace("-", "_")
        raise CatalogUnsupported(f"catalog '{name}'{of} is not configured: define it under 'catalog:' in .pyiceberg.yaml "
                                 f"($PYICEBERG_HOME, ~ or the working folder) or with PYICEBERG_CATALOG__{variable}__TYPE=... "
                                 "variables")
    return _flat(found or {})


def _flat(props: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in props.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return flat


def private_folder(path: Path) -> None:
    """Create ``path`` readable by its owner only (0700): a warehouse holds the data and the job records."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (SQLite gives its -wal and -shm files the same mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
