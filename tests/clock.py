"""A clock the test controls, for quiet hours and the source rate: no test sleeps through a night.

It stands still unless the test moves it (`advance_to`), a sleep moves it by the time slept, and a
wait for an instant (a paused job) jumps to that instant after running the test's hooks (which see the
job paused). For a Step Functions Wait state, which moto runs on the real clock, `workflow_instant`
answers "in two seconds" (``workflow_wait``) and makes the jump happen a second before that, so the
execution's Wait ends just after this clock has reached the instant it waits for.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import datetime
from zoneinfo import ZoneInfo


class TestClock:
    __test__ = False  # not a test class, whatever its name

    def __init__(self, start: float, workflow_wait: int = 2) -> None:
        self._now = start
        self.workflow_wait = workflow_wait  # real seconds a Wait state of the workflow waits
        self._lock = threading.Lock()
        self._jumps: list[tuple[float, float]] = []  # (real time, instant this clock then reads)
        self.on_wait: list[Callable[[float], None]] = []  # called with the instant a paused job waits for
        self.on_sleep: list[Callable[[float], None]] = []  # called with the clock's time after each sleep
        self.waits: list[tuple[float, float]] = []  # (from, until) of each wait for an instant
        self.slept = 0.0

    @classmethod
    def at(cls, local: str, tz: str) -> "TestClock":
        """A clock reading ``local`` (``2030-01-07 05:59``) in zone ``tz``."""
        return cls(datetime.fromisoformat(local).replace(tzinfo=ZoneInfo(tz)).timestamp())

    def now(self) -> float:
        with self._lock:
            real = time.time()
            while self._jumps and self._jumps[0][0] <= real:
                self._now = max(self._now, self._jumps.pop(0)[1])
            return self._now

    def advance_to(self, instant: float) -> None:
        with self._lock:
            self._now = max(self._now, instant)

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._now += max(seconds, 0.0)
            self.slept += max(seconds, 0.0)
            now = self._now
        for hook in list(self.on_sleep):
            hook(now)

    def wait_until(self, instant: float, poll: Callable[[], None]) -> None:
        self.waits.append((self.now(), instant))
        for hook in list(self.on_wait):
            hook(instant)
        poll()
        self.advance_to(instant)

    def workflow_instant(self, instant: float) -> float:
        with self._lock:
            for real, target in self._jumps:
                if target == instant:
                    return real + 1
            real = math.ceil(time.time()) + self.workflow_wait
            self._jumps.append((real - 1, instant))
            self._jumps.sort()
            return real
