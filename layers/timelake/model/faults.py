"""Named crash points, so tests can kill a real process at each step boundary and then resume.

Set ``TIMELAKE_CRASH_AT=<point>`` (or ``<point>:<n>`` to crash at the n-th pass) and the process
exits at once with status 137, as if killed: no cleanup, no state update, no exception handlers.
``TIMELAKE_SLOW_AT=<point>:<seconds>`` sleeps there instead, to hold a step open while another
process acts (an abort during a publish commit). In-process tests can run a function at a point
with ``at(point, fn)``, to act exactly between two steps of a running job.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_passes: Counter[str] = Counter()
_hooks: dict[str, list[Callable[[], None]]] = {}


def checkpoint(point: str) -> None:
    for hook in list(_hooks.get(point, ())):
        hook()
    slow, _, seconds = os.environ.get("TIMELAKE_SLOW_AT", "").partition(":")
    if slow == point:
        time.sleep(float(seconds or 1))
    wanted = os.environ.get("TIMELAKE_CRASH_AT")
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != point:
        return
    _passes[point] += 1
    if _passes[point] >= int(nth or 1):
        os._exit(137)


@contextmanager
def at(point: str, hook: Callable[[], None]) -> Iterator[None]:
    """Run ``hook`` each time any thread of this process passes ``point``, inside the block."""
    _hooks.setdefault(point, []).append(hook)
    try:
        yield
    finally:
        _hooks[point].remove(hook)
