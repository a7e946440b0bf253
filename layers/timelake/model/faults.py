"""Named crash points, so tests can kill a real process at each step boundary and then resume.

Set ``TIMELAKE_CRASH_AT=<point>`` (or ``<point>:<n>`` to crash at the n-th pass) and the process
exits at once with status 137, as if killed: no cleanup, no state update, no exception handlers.
"""

from __future__ import annotations

import os
from collections import Counter

_passes: Counter[str] = Counter()


def checkpoint(point: str) -> None:
    wanted = os.environ.get("TIMELAKE_CRASH_AT")
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != point:
        return
    _passes[point] += 1
    if _passes[point] >= int(nth or 1):
        os._exit(137)
