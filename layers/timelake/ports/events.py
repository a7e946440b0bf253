"""Events the engine emits after publish. Rollup refresh subscribes; on AWS this is EventBridge."""

from __future__ import annotations

from typing import Any, Protocol

BACKFILL_PUBLISHED = "Backfill Published"


class EventBus(Protocol):
    def put(self, detail_type: str, detail: dict[str, Any]) -> None: ...
