"""How a process running the engine's work manages its memory (`timelake.memory`). The allocator's
thresholds are the process's, so each case of them runs in a fresh interpreter."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

import pytest

from timelake import memory

# Arrays of a unit's size (432,000 int64: a day of one-minute readings from 300 devices) made and freed as a
# writer does, counting the page faults they cost: each fault is a page the kernel zeroed again.
CHURN = """
import json, resource, sys
import numpy as np
from timelake import memory
if sys.argv[1] == "tune":
    memory.tune()
keys = np.random.default_rng(0).integers(0, 1 << 40, 432_000)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # the first arrays fault in whatever the setting
    packed = np.sort(keys + 1); kept = packed[packed > 5]; del packed, kept
before = faults()
for _ in range(100):
    packed = np.sort(keys + 1); kept = packed[packed > 5]; del packed, kept
print(json.dumps({"faults": (faults() - before) / 100}))
"""
PAGES = 432_000 * 8 // os.sysconf("SC_PAGE_SIZE")  # one array's pages
GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None


def churn(mode: str, **env: str) -> float:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CHURN, mode], env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["faults"]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc")
def test_freed_arrays_stay_in_the_heap_instead_of_faulting_in_again() -> None:
    default, tuned = churn("default"), churn("tune")
    assert default > PAGES  # glibc's starting thresholds give the arrays back and fault them in again
    assert tuned < PAGES / 4, (tuned, default)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc")
def test_settings_the_user_chose_are_kept() -> None:
    assert churn("tune", MALLOC_TRIM_THRESHOLD_="131072") > PAGES  # the user's small threshold, not a warmed one


def test_objects_of_before_a_job_are_left_out_of_collections_while_it_runs() -> None:
    assert gc.get_freeze_count() == 0
    entered, leave = threading.Event(), threading.Event()

    def other_job() -> None:
        with memory.frozen():
            entered.set()
            leave.wait(10)

    with memory.frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the imported libraries
        worker = threading.Thread(target=other_job)
        worker.start()
        assert entered.wait(10)
    assert gc.get_freeze_count() >= frozen  # the other job still runs: nothing is unfrozen under it
    leave.set()
    worker.join()
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_own_objects_keeps_them_frozen() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with memory.frozen():
            pass
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()
