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

Python's collector is held two ways while the engine works, each a setting of the process that the first
of overlapping blocks makes and the last one out undoes (`_Held`): `frozen` keeps the objects that exist
when a job starts (the imported libraries: pyiceberg, pyarrow, pandas, SQLAlchemy, hundreds of thousands
of objects) out of the collector's full collections while the job runs: each walked them all again,
40-60 ms, a few times a job; `collector_paused` stops it for a step that builds tens of thousands of
metadata objects living until it ends (stage, publish).
"""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

WARM_BYTES = (32 << 20) - (64 << 10)  # under glibc's DEFAULT_MMAP_THRESHOLD_MAX: a free of it raises the thresholds

_lock = threading.Lock()
_warmed: list[bool] = []


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


class _Held:
    """A setting of the whole process held while any of its blocks runs, in any thread: the first block in
    makes it (``make`` returns what ``undo`` needs), the last one out undoes it."""

    def __init__(self, make: Callable[[], bool], undo: Callable[[bool], None]) -> None:
        self._make, self._undo = make, undo
        self._lock = threading.Lock()
        self._blocks = 0
        self._made = False

    @contextmanager
    def block(self) -> Iterator[None]:
        with self._lock:
            if self._blocks == 0:
                self._made = self._make()
            self._blocks += 1
        try:
            yield
        finally:
            with self._lock:
                self._blocks -= 1
                if self._blocks == 0:
                    self._undo(self._made)


def _freeze() -> bool:
    if gc.get_freeze_count():  # frozen by the process itself (a pre-fork server): left as it is
        return False
    gc.freeze()
    return True


def _pause() -> bool:
    collecting = gc.isenabled()
    gc.disable()
    return collecting


_FROZEN = _Held(_freeze, lambda froze: gc.unfreeze() if froze else None)
_PAUSED = _Held(_pause, lambda collecting: gc.enable() if collecting else None)


def frozen() -> AbstractContextManager[None]:
    """The collector leaves the objects that exist now out of its collections until the block ends. The
    first of overlapping blocks (jobs in threads of one process) freezes, so a process whose jobs overlap
    without end freezes only what it held before the first; what later jobs leave in cycles is collected
    as usual. A process whose objects are frozen already (a pre-fork server freezes its own) is left as it is."""
    return _FROZEN.block()


def collector_paused() -> AbstractContextManager[None]:
    """The collector stopped for a step that builds tens of thousands of metadata objects living until it
    ends (decoded unit results, DataFiles, manifest entries): every full collection walks all of them
    again, a third of the CPU of a 10,000-file stage or publish. What a step leaves in cycles is collected
    after it, when the collector runs again as it did before."""
    return _PAUSED.block()
