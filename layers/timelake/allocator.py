"""The process's C allocator, set for the engine's arrays.

A unit's work makes and frees numpy arrays of a few MB many times a second: a day's packed keys, its
sort order, masks, gathered columns. glibc's malloc gives the free top of its heap back to the system
once it passes twice the largest block recently freed (its dynamic trim threshold), so such arrays
were given back and faulted in again, page by page, zeroed by the kernel, at almost every unit: a merge
job of 12.96M rows took 155,000-170,000 page faults, 50,000 once freed memory stays in the heap, and
validating a staged day file against main took about a third less CPU. ``tune`` fixes the two
thresholds: blocks below 32 MiB (glibc's own ceiling for the dynamic one) come from the heap, and up
to 128 MiB of free heap top is kept for the next unit rather than given back. Peak memory is the same:
what is kept was in use a moment before.

Where the C library is not glibc, or the user chose malloc's settings (``MALLOC_*_`` variables or
``GLIBC_TUNABLES``), nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import threading

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

_lock = threading.Lock()
_done: list[bool] = []


def tune() -> bool:
    """Set the thresholds once per process (a worker, a Lambda container, a process running a job);
    whether they are set by us."""
    with _lock:
        if not _done:
            _done.append(_set())
        return _done[0]


def _set() -> bool:
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator keeps its own ways
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
