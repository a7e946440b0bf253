"""The embedded adapters: an event bus and an alarm sink that live in the job's process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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


class InProcessAlarms:
    """The embedded sink: keeps every alarm and calls subscribers (a notifier, a test's recorder)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self._subscribers: list[Any] = []

    def subscribe(self, handler: Any) -> None:
        self._subscribers.append(handler)

    def notify(self, table: str, event: dict[str, Any]) -> None:
        self.sent.append((table, event))
        for handler in self._subscribers:
            handler(table, event)
