"""Worker processes for a large job's fan-out: plain interpreters that run `serve`.

multiprocessing prepares every worker it starts (spawn or forkserver) from the parent's ``__main__``:
a worker imports the caller's script again, and a script without ``if __name__ == "__main__":`` (as
most pyiceberg scripts are) would create tables and start jobs again there. The usual way around it,
renaming ``__main__`` while the pool starts, changes the caller's process, and two jobs fanning out on
threads of one process can leave it renamed. These workers are plain interpreters running this module:
nothing of the caller's process is read or changed. Each runs one call at a time, sent over its own
socket pair, whose end the worker inherits as a file descriptor.
"""

from __future__ import annotations

import importlib
import multiprocessing
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any

WORKER = "import sys; from timelake.workers import serve; serve(int(sys.argv[1]))"  # the worker's whole program


class WorkerPool(Executor):
    """An `Executor` over worker processes: ``submit(fn, *args)`` runs module-level ``fn`` in one of
    them (``fn`` and ``args`` are pickled, as with a process pool). Workers start as calls need them,
    up to ``max_workers``: a caller that keeps N calls running has N workers. A worker that dies fails
    the call it was running with `BrokenProcessPool`, and the pool's later calls with it too."""

    def __init__(self, max_workers: int) -> None:
        self._max = max_workers
        self._calls: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._broken: str | None = None
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting for a call
        self._threads: list[threading.Thread] = []
        self._processes: list[subprocess.Popen] = []

    def _start(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        process = subprocess.Popen([sys.executable, "-c", WORKER, str(theirs.fileno())], pass_fds=[theirs.fileno()])
        theirs.close()
        thread = threading.Thread(target=self._serve, args=(process, ours), daemon=True, name=f"timelake-worker-{process.pid}")
        self._processes.append(process)
        self._threads.append(thread)
        thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if kwargs:
            raise TypeError("WorkerPool.submit takes positional arguments only")
        future: Future = Future()
        if self._broken:
            future.set_exception(BrokenProcessPool(self._broken))
            return future
        with self._lock:  # ``_idle``: workers at (or on their way to) the queue with no call meant for them yet
            if self._idle <= 0 and len(self._processes) < self._max:
                self._start()
            self._idle -= 1
            self._calls.put((future, fn, args))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while True:
                try:
                    call = self._calls.get_nowait()
                except queue.Empty:
                    break
                if call is not None:
                    call[0].cancel()
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
            for process in self._processes:
                process.wait()

    def _serve(self, process: subprocess.Popen, connection: Connection | None) -> None:
        """Feed one worker its calls, one at a time, until the pool shuts down or the worker dies."""
        try:
            while True:
                with self._lock:
                    self._idle += 1
                call = self._calls.get()
                if call is None or connection is None:
                    if call is not None:
                        call[0].set_exception(BrokenProcessPool(self._broken or "worker pool broken"))
                        continue
                    break
                future, fn, args = call
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    connection.send((fn.__module__, fn.__qualname__, args))
                    ok, value = connection.recv()
                except (EOFError, OSError):
                    self._broken = f"a worker process (pid {process.pid}) ended abruptly, exit code {process.wait()}"
                    future.set_exception(BrokenProcessPool(self._broken))
                    connection = None
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        finally:
            if connection is not None:
                try:
                    connection.send(None)
                except OSError:
                    pass
                connection.close()

def serve(fd: int) -> None:
    """A worker's life: run the calls that come over ``fd`` until told to stop."""
    connection = Connection(fd)
    while True:
        call = connection.recv()
        if call is None:
            return
        module, name, args = call
        try:
            target = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
            result = (True, target(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller's future raises it
            result = (False, exc)
        connection.send(result)

