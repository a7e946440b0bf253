"""Quiet hours: the daily window in which a job may work (``run_between``, in ``run_tz``).

A job reads its source, writes, checks and publishes only inside the window; when the window closes it
lets running units finish, starts no new one and waits for the next opening. The window is wall-clock
time in its zone, so it moves with daylight saving time: ``22:00-06:00`` in Europe/Berlin is 21:00-05:00
UTC in winter and 20:00-04:00 UTC in summer. On a day whose clock skips the opening time (a spring-forward
gap), the window opens when the clock jumps past it; a clock set back (in autumn) into the window opens
it again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from timelake.ports.store import JobState

PAUSED_UNTIL: Final = "paused_until"  # job state: the instant (the runtime clock's epoch seconds) the window opens next
PAUSES: Final = "pauses"  # job state: [start, end] of each pause, end None while it lasts
_TEXT = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
DEFAULT_TZ = "UTC"


@dataclass(frozen=True)
class Window:
    start: int  # minutes after local midnight
    end: int
    tz: str

    @classmethod
    def parse(cls, text: str, tz: str = DEFAULT_TZ) -> Window:
        """``HH:MM-HH:MM``; an end before the start spans midnight (``22:00-06:00``)."""
        found = _TEXT.match(text)
        if not found:
            raise ValueError(f"run_between '{text[:40]}' is not HH:MM-HH:MM (example: 22:00-06:00)")
        h1, m1, h2, m2 = (int(g) for g in found.groups())
        if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
            raise ValueError(f"run_between '{text.strip()}': hours run 00-23 and minutes 00-59")
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if start == end:
            raise ValueError(f"run_between '{text.strip()}' starts where it ends; leave it out to run at any time")
        return cls(start, end, tz)

    def __str__(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d} {self.tz}"

    def contains(self, instant: float) -> bool:
        local = datetime.fromtimestamp(instant, ZoneInfo(self.tz))
        minute = local.hour * 60 + local.minute + (local.second + local.microsecond / 1e6) / 60
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end

    def next_open(self, instant: float) -> float:
        """``instant`` if the window is open then, else the instant it next opens: when the local clock
        reads the window's start, or jumps into the window (a daylight-saving change)."""
        if self.contains(instant):
            return instant
        zone = ZoneInfo(self.tz)
        today = datetime.fromtimestamp(instant, zone).date()
        readings = (naive_day.replace(tzinfo=zone, fold=fold).timestamp() for d in range(-1, 3) for fold in (0, 1)
                    for naive_day in [datetime.combine(today + timedelta(days=d), time(self.start // 60, self.start % 60))])
        candidates = [*readings, *_transitions(zone, instant, instant + 3 * 86_400)]
        return min(t for t in candidates if t > instant and self.contains(t))


def _transitions(zone: ZoneInfo, start: float, end: float) -> list[float]:
    """The instants in [start, end] at which the zone's offset changes (zones change on whole seconds)."""
    def offset(t: float) -> timedelta | None:
        return datetime.fromtimestamp(t, zone).utcoffset()

    found, t = [], start
    while t < end:
        if offset(t) != offset(t + 3600):
            low, high = t, t + 3600
            while high - low > 1e-3:
                middle = (low + high) / 2
                low, high = (low, middle) if offset(middle) != offset(low) else (middle, high)
            found.append(float(round(high)))
        t += 3600
    return found


def window_of(spec: dict[str, Any]) -> Window | None:
    """A job's quiet hours from its spec document: ``run_between`` in ``run_tz``, else in the zone of its
    source times (``tz``), else UTC; None without them."""
    between = spec.get("run_between")
    return Window.parse(between, spec.get("run_tz") or spec.get("tz") or DEFAULT_TZ) if between else None


def iso_local(instant: float, tz: str) -> str:
    """The instant in ISO 8601 with the zone's offset, e.g. ``2025-01-06T22:00:00+01:00``."""
    return datetime.fromtimestamp(instant, ZoneInfo(tz)).isoformat(timespec="seconds")


def paused_seconds(state: JobState, start: float, end: float) -> float:
    """Seconds of ``[start, end]`` the job spent paused; a pause that lasts runs to ``end``."""
    return sum(max(0.0, min(end, b if b is not None else end) - max(start, a)) for a, b in state.get(PAUSES, []))
