"""Where a job runs: catalog, job store, event bus and file system, rebuilt from a small JSON config.

Steps receive a `Runtime` instead of globals so the same step code runs in a writer process, a
Lambda, or the CLI; each of those rebuilds the runtime from `LakeConfig`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
from pydantic import BaseModel, Field
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table as IcebergTable

from .errors import TableNotFound
from .events import EventBus, InProcessBus
from .store import JobStore, SqliteJobStore

if TYPE_CHECKING:
    from .rules import AlarmSink

DEFAULT_WAREHOUSE = "./.timelake"


class LakeConfig(BaseModel):
    catalog_name: str = "timelake"
    catalog_props: dict[str, str] = Field(default_factory=dict)
    store: str = Field(description="sqlite:///path/jobs.db (embedded) or dynamodb://table (AWS)")
    staging: str = Field(description="Root URI for job scratch files (spills, unit manifests)")
    events: str | None = Field(default=None, description="eventbridge://BUS on AWS; None: the in-process bus")
    alarms: str | None = Field(default=None, description="sns://TOPIC_ARN for the live path's real-time alarms; "
                               "None: in-process. Backfills never send to it")

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
        root.mkdir(parents=True, exist_ok=True)
        return cls(
            catalog_name="timelake",
            catalog_props={"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"},
            store=f"sqlite:///{root}/jobs.db",
            staging=f"file://{root}/_backfill",
        )


class Runtime:
    def __init__(self, config: LakeConfig, bus: EventBus | None = None, alarms: "AlarmSink | None" = None) -> None:
        self.config = config
        self.bus: EventBus = bus or _bus(config)
        self._alarms = alarms

    @functools.cached_property
    def alarms(self) -> "AlarmSink":
        """The real-time alarm sink; only the live path (`rules.evaluate_live`) uses it."""
        if self._alarms is not None:
            return self._alarms
        if self.config.alarms and self.config.alarms.startswith("sns://"):
            from .aws.alarms import SnsAlarmSink

            return SnsAlarmSink(self.config.alarms.removeprefix("sns://"))
        from .rules import InProcessAlarms

        return InProcessAlarms()

    @functools.cached_property
    def catalog(self) -> Catalog:
        return load_catalog(self.config.catalog_name, **self.config.catalog_props)

    @functools.cached_property
    def store(self) -> JobStore:
        if self.config.store.startswith("sqlite:///"):
            return SqliteJobStore(self.config.store.removeprefix("sqlite:///"))
        if self.config.store.startswith("dynamodb://"):
            from .aws.store import DynamoJobStore

            return DynamoJobStore(self.config.store.removeprefix("dynamodb://"))
        raise ValueError(f"unsupported job store '{self.config.store}'")

    def load_table(self, name: str) -> IcebergTable:
        try:
            return self.catalog.load_table(name)
        except NoSuchTableError:
            known = [".".join(t) for ns in self.catalog.list_namespaces() for t in self.catalog.list_tables(ns)]
            raise TableNotFound(f"table '{name}' does not exist (tables: {', '.join(known) or 'none'})") from None

    def staging_path(self, job_id: str, *parts: str) -> str:
        return "/".join([self.config.staging.rstrip("/"), job_id, *parts])


def _bus(config: LakeConfig) -> EventBus:
    if config.events and config.events.startswith("eventbridge://"):
        from .aws.events import EventBridgeBus

        return EventBridgeBus(config.events.removeprefix("eventbridge://"))
    return InProcessBus()


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and path for a local path, file:// or s3:// URI."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).resolve())
    if uri.startswith("s3://") and os.environ.get("TIMELAKE_S3_ENDPOINT"):
        endpoint = os.environ["TIMELAKE_S3_ENDPOINT"]
        scheme, _, host = endpoint.partition("://")
        fs = pafs.S3FileSystem(endpoint_override=host, scheme=scheme, region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        return fs, uri.removeprefix("s3://")
    return pafs.FileSystem.from_uri(uri)


_RUNTIMES: dict[str, Runtime] = {}


def runtime_for(config: dict[str, Any] | LakeConfig) -> Runtime:
    """One runtime per config per process: writer processes reuse their catalog connection."""
    cfg = config if isinstance(config, LakeConfig) else LakeConfig.model_validate(config)
    key = cfg.model_dump_json()
    if key not in _RUNTIMES:
        _RUNTIMES[key] = Runtime(cfg)
    return _RUNTIMES[key]
