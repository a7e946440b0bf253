"""Events the engine emits after publish. Rollup refresh subscribes; on AWS this is EventBridge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

BACKFILL_PUBLISHED = "Backfill Published"


class EventBus(Protocol):
    def put(self, detail_type: str, detail: dict[str, Any]) -> None: ...


class InProcessBus:
    """Calls subscribers synchronously and keeps the history, for the embedded runner and tests."""

    def __init__(self) -> None:
        self.history: list[tuple[str, dict[str, Any]]] = []
        self._subscribers: list[tuple[str, Callable[[dict[str, Any]], None]]] = []

    def subscribe(self, detail_type: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self._subscribers.append((detail_type, handler))

    def put(self, detail_type: str, detail: dict[str, Any]) -> None:
        self.history.append((detail_type, detail))
        for wanted, handler in self._subscribers:
            if wanted == detail_type:
                handler(detail)
