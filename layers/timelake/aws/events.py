"""The event bus on AWS: engine events become EventBridge events that rollup refresh subscribes to.

``PutEvents`` can succeed as a call yet reject an entry (``FailedEntryCount``), so a lost event
would pass silently; this bus retries rejected entries and raises when one stays rejected, because
a missed ``Backfill Published`` leaves rollups stale with nobody told.
"""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from timelake.errors import BackfillError

SOURCE = "timelake.backfill"
_PERMANENT = {"InvalidArgument", "MalformedDetail", "AccessDeniedException", "NotAuthorizedForSourceException"}


class EventPublishError(BackfillError):
    """EventBridge did not accept an event; the message names the bus and EventBridge's reason."""


class EventBridgeBus:
    """Puts each event on one custom bus with source ``timelake.backfill`` and the detail as JSON."""

    def __init__(self, bus_name: str, client: Any = None, attempts: int = 4, backoff: float = 0.2) -> None:
        self.bus_name = bus_name
        self.attempts = attempts
        self.backoff = backoff
        self._client = client or boto3.client("events", config=Config(retries={"mode": "standard"}))

    def put(self, detail_type: str, detail: dict[str, Any]) -> None:
        """Rejected entries are retried with exponential backoff (throttling and internal failures
        pass); errors that cannot pass on retry (bad input, permissions) raise at once."""
        entry = {
            "Source": SOURCE, "DetailType": detail_type, "Detail": json.dumps(detail), "EventBusName": self.bus_name,
        }
        for attempt in range(self.attempts):
            try:
                response = self._client.put_events(Entries=[entry])
            except ClientError as exc:
                error = exc.response.get("Error", {})
                raise EventPublishError(self._why(detail_type, error.get("Code"), error.get("Message"))) from exc
            if not response.get("FailedEntryCount"):
                return
            failed = response["Entries"][0]
            code, message = failed.get("ErrorCode"), failed.get("ErrorMessage")
            if code in _PERMANENT or attempt == self.attempts - 1:
                raise EventPublishError(self._why(detail_type, code, message, attempt + 1))
            time.sleep(self.backoff * 2**attempt)

    def _why(self, detail_type: str, code: str | None, message: str | None, attempts: int = 1) -> str:
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        return f"EventBridge bus '{self.bus_name}' rejected event '{detail_type}'{tries}: {code}: {message}"
