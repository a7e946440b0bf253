"""The allocator setting that keeps freed arrays in the heap (`timelake.allocator`), in fresh interpreters:
malloc's settings are the process's, so each case gets its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Arrays of a unit's size (432,000 int64: a day of one-minute readings from 300 devices) made and freed as a
# writer does, counting the page faults they cost: each fault is a page the kernel zeroed again.
CHURN = """
import json, resource, sys
import numpy as np
from timelake import allocator
tuned = allocator.tune() if sys.argv[1] == "tune" else None
keys = np.random.default_rng(0).integers(0, 1 << 40, 432_000)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # the first arrays fault in whatever the setting
    packed = np.sort(keys + 1); kept = packed[packed > 5]; del packed, kept
before = faults()
for _ in range(100):
    packed = np.sort(keys + 1); kept = packed[packed > 5]; del packed, kept
print(json.dumps({"tuned": tuned, "faults": (faults() - before) / 100}))
"""


def churn(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CHURN, mode], env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's malloc")
def test_freed_arrays_stay_in_the_heap_instead_of_faulting_in_again() -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    pages = 432_000 * 8 // page  # one array's pages
    default, tuned = churn("default"), churn("tune")
    assert tuned["tuned"] is True
    assert default["faults"] > pages, default  # glibc's own thresholds give the arrays back and fault them in again
    assert tuned["faults"] < pages / 4, (tuned, default)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's malloc")
def test_settings_the_user_chose_are_kept() -> None:
    chosen = churn("tune", MALLOC_TRIM_THRESHOLD_="131072")
    assert chosen["tuned"] is False
    assert chosen["faults"] > 432_000 * 8 // os.sysconf("SC_PAGE_SIZE")  # the user's small threshold, not ours
