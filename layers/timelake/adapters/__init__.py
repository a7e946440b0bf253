"""The adapters, and the one place that picks them: a `LakeConfig` names its job store, event bus and
alarm sink by URI and its catalog by name and properties, and `compose` builds the matching embedded
or AWS implementations, the pyiceberg catalog (`catalog`), pyarrow's object IO (`objects`) and the
system's clock.

Only the runner and the interfaces import this package; the model, the steps, the sources and the
after-publish work see the adapters through `timelake.ports` alone.
"""

from __future__ import annotations

from typing import Any

from timelake.adapters.catalog import catalog_for
from timelake.adapters.local import InProcessAlarms, InProcessBus, SystemClock
from timelake.adapters.objects import ArrowObjects
from timelake.adapters.sqlite import SqliteJobStore
from timelake.ports.alarms import AlarmSink
from timelake.ports.events import EventBus
from timelake.ports.runtime import LakeConfig, Runtime
from timelake.ports.store import JobStore


def compose(config: LakeConfig, bus: EventBus | None = None, alarms: AlarmSink | None = None) -> Runtime:
    """A runtime for ``config``; ``bus`` and ``alarms`` replace the configured ones (tests, the demo)."""
    return Runtime(config, bus or _bus(config), lambda: _store(config), (lambda: alarms) if alarms else lambda: _alarms(config),
                   lambda: catalog_for(config), ArrowObjects(), SystemClock())


_RUNTIMES: dict[str, Runtime] = {}


def runtime_for(config: dict[str, Any] | LakeConfig) -> Runtime:
    """One runtime per config per process: writer processes reuse their catalog connection."""
    cfg = config if isinstance(config, LakeConfig) else LakeConfig.model_validate(config)
    key = cfg.model_dump_json()
    if key not in _RUNTIMES:
        _RUNTIMES[key] = compose(cfg)
    return _RUNTIMES[key]


def _store(config: LakeConfig) -> JobStore:
    return store_for(config.store)


def store_for(uri: str) -> JobStore:
    """The job store a `LakeConfig.store` URI names."""
    if uri.startswith("sqlite:///"):
        return SqliteJobStore(uri.removeprefix("sqlite:///"))
    if uri.startswith("dynamodb://"):
        from timelake.aws.store import DynamoJobStore

        table, _, query = uri.removeprefix("dynamodb://").partition("?")
        options = dict(part.split("=", 1) for part in query.split("&") if part)
        if set(options) - {"unit_ttl_days"}:
            raise ValueError(f"unsupported job store option in '{uri}': only unit_ttl_days is known")
        return DynamoJobStore(table, **{"unit_ttl_days": int(options["unit_ttl_days"])} if options else {})
    raise ValueError(f"unsupported job store '{uri}'")


def _bus(config: LakeConfig) -> EventBus:
    if config.events and config.events.startswith("eventbridge://"):
        from timelake.aws.events import EventBridgeBus

        return EventBridgeBus(config.events.removeprefix("eventbridge://"))
    return InProcessBus()


def _alarms(config: LakeConfig) -> AlarmSink:
    if config.alarms and config.alarms.startswith("sns://"):
        from timelake.aws.alarms import SnsAlarmSink

        return SnsAlarmSink(config.alarms.removeprefix("sns://"))
    return InProcessAlarms()
