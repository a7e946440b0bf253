"""How a process running the engine's work manages its memory (`timelake.memory`). The allocator's
thresholds are the process's, so each case of them runs in a fresh interpreter."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

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


# Freezing is the process's too: each case runs alone in a fresh interpreter, where no other test's job runs.
JOBS = """
import gc, json, threading
from timelake import memory
entered, leave, seen = threading.Event(), threading.Event(), {}
def other_job():
    with memory.frozen():
        entered.set()
        leave.wait(10)
seen["before"] = gc.get_freeze_count()
with memory.frozen():
    seen["during"] = gc.get_freeze_count()
    worker = threading.Thread(target=other_job)
    worker.start()
    entered.wait(10)
seen["other_still_running"] = gc.get_freeze_count()
leave.set()
worker.join()
seen["after"] = gc.get_freeze_count()
gc.freeze()  # a process that freezes its own objects (a pre-fork server)
seen["own"] = gc.get_freeze_count()
made_since = [[i] for i in range(10_000)]  # what a second freeze would take too
with memory.frozen():
    pass
seen["own_after"] = gc.get_freeze_count()
print(json.dumps(seen))
"""


def test_objects_of_before_a_job_are_left_out_of_collections_while_it_runs() -> None:
    seen = json.loads(subprocess.run([sys.executable, "-c", JOBS], capture_output=True, text=True, check=True).stdout)
    assert seen["before"] == 0
    assert seen["during"] > 1000  # the imported libraries
    assert seen["other_still_running"] > 1000  # the first job's end unfreezes nothing under a job still running
    assert seen["after"] == 0
    # a process's own freeze is left as it is: not undone, nor extended to what it made since (the count of
    # frozen objects moves by a few on its own as objects are re-tracked)
    assert seen["own"] > 1000 and abs(seen["own_after"] - seen["own"]) < 1000


def test_collector_paused_nests_and_restores_the_collector():
    assert gc.isenabled()
    with memory.collector_paused():
        assert not gc.isenabled()
        with memory.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    gc.disable()
    try:
        with memory.collector_paused():
            pass
        assert not gc.isenabled()  # a collector the process had switched off stays off
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), memory.collector_paused():
        raise RuntimeError("a failing step")
    assert gc.isenabled()
