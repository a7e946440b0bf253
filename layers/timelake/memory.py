"""How a process running the engine's work manages its memory: the C allocator's heap and Python's collector.

A unit's work makes and frees numpy arrays of a few MB many times a second: a day's packed keys, its
sort order, masks, gathered columns. glibc's malloc maps a block above its mmap threshold on its own and
gives the free top of its heap back to the system past its trim threshold; both start small (128 KB) and
rise only as the program frees mapped blocks. Until then such arrays were mapped or given back and
faulted in again, page by page, zeroed by the kernel, at almost every unit: a merge job of 12.96M rows
took 155,000-170,000 page faults, 50,000 once they stay in the heap, and validating a staged day file
against main took about a third less CPU. `tune` frees one mapped block of nearly glibc's largest
dynamic threshold (32 MB on 64-bit), which raises both thresholds the way any program's first large free
would: no ``mallopt``, so the allocator keeps adapting and the process's settings stay its own (where
the user set them, ``MALLOC_*_`` or ``GLIBC_TUNABLES``, glibc no longer adapts and nothing changes).

`frozen` keeps the objects that exist when a job starts (the imported libraries: pyiceberg, pyarrow,
pandas, SQLAlchemy, hundreds of thousands of objects) out of the collector's full collections while
the job runs: each walked them all again, 40-60 ms, a few times a job.
"""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

WARM_BYTES = (32 << 20) - (64 << 10)  # under glibc's DEFAULT_MMAP_THRESHOLD_MAX: a free of it raises the thresholds

_lock = threading.Lock()
_warmed: list[bool] = []
_frozen_by_us = 0  # jobs running inside `frozen`; the last one out unfreezes


def tune() -> None:
    """Raise the C allocator's thresholds once per process (a worker, a Lambda container, a process
    running a job), before the first array is made."""
    with _lock:
        if _warmed:
            return
        _warmed.append(True)
    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):  # no C library to reach: nothing to warm
        return
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    block = malloc(WARM_BYTES)
    if block:
        free(block)


@contextmanager
def frozen() -> Iterator[None]:
    """The collector leaves the objects that exist now out of its collections until the block ends.
    Nested and concurrent blocks count: the first one in freezes, the last one out unfreezes, so a process
    whose jobs overlap without end freezes only what it held before the first (what later jobs leave in
    cycles is collected as usual). A process whose objects are frozen already (a pre-fork server freezes
    its own) is left as it is."""
    global _frozen_by_us
    with _lock:
        ours = _frozen_by_us > 0 or gc.get_freeze_count() == 0
        if ours:
            if _frozen_by_us == 0:
                gc.freeze()
            _frozen_by_us += 1
    try:
        yield
    finally:
        if ours:
            with _lock:
                _frozen_by_us -= 1
                if _frozen_by_us == 0:
                    gc.unfreeze()
