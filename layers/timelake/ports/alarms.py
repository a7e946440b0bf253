"""Where the live path's real-time alarms go. Backfills never send to it."""

from __future__ import annotations

from typing import Any, Protocol


class AlarmSink(Protocol):
    """Where real-time alarms go (a pager, SNS, an alarm bus). Only the live path calls it."""

    def notify(self, table: str, event: dict[str, Any]) -> None: ...
