"""The embedded adapters: an event bus and an alarm sink that live in the job's process, and the
system's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from timelake.ports.clock import POLL_SECONDS


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


class SystemClock:
    """The clock every job runs on (`timelake.ports.clock.Clock`): the system's time, real sleeps."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait_until(self, instant: float, poll: Callable[[], object]) -> None:
        while True:
            poll()
            left = instant - time.time()
            if left <= 0:
                return
            time.sleep(min(left, POLL_SECONDS))

    def workflow_instant(self, instant: float) -> float:
        return instant
