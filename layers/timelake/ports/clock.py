"""Time as the engine waits on it: quiet hours (`timelake.model.window`) and the source rate budget.

A port, so that a test can run a job across a night without sleeping through it: the runtime's clock
(`Runtime.clock`) says what time it is, sleeps, and waits for an instant while staying interruptible.
Everything else (timestamps in job records, retention cutoffs) keeps the system's time. The clock a
job runs on unless a test sets its own is the system's, `timelake.adapters.local.SystemClock`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

POLL_SECONDS = 1.0  # how often a paused job looks for Ctrl-C or an abort: the delay before it notices one


class Clock(Protocol):
    def now(self) -> float:
        """Epoch seconds."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait_until(self, instant: float, poll: Callable[[], object]) -> None:
        """Return at ``instant``; meanwhile call ``poll`` at least every `POLL_SECONDS`, which raises to
        stop waiting (an interrupted or aborted job); what it returns is ignored."""
        ...

    def workflow_instant(self, instant: float) -> float:
        """When, by the workflow's clock (AWS's: real UTC), this clock reads ``instant``: what a Step
        Functions Wait state waits until. The same instant for the system clock."""
        ...


def wait_timestamp(instant: float) -> str:
    """``instant`` as a Wait state's ``TimestampPath`` value: whole seconds, rounded up (a Wait that
    ends a moment early would only find the window still closed), UTC with a ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(instant)))
