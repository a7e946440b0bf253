"""The compiled run search built with AddressSanitizer and UndefinedBehaviorSanitizer, on random inputs.

The test compiles ``_runs.c`` as the install does, plus the sanitizers, and runs it in a child interpreter
on random batches of every length from none to a few thousand: times spanning the whole int64 range (its
two ends included, where a bucket's bounds would overflow), times in runs of one series and day before and
after 1970, widths from one to the widest, with and without a series, and every limit from none to more
runs than there are, each checked against numpy; then runs of equal values up to every limit, and ranges
laid end to end, starting anywhere in int64, against Python's integers, and sizes it must refuse; sums per
code against numpy's bincount, and codes outside the slots it must refuse. Any report of either sanitizer stops the child.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.sanitized import ROOT, load, run_sanitized

SOURCE = ROOT / "layers" / "timelake" / "model" / "_runs.c"
ROUNDS = 600
DAY = 86_400_000_000
INT64 = np.iinfo(np.int64)


def test_compiled_run_search_is_clean_under_both_sanitizers(tmp_path: Path) -> None:
    printed = run_sanitized(SOURCE, tmp_path, "tests.model.test_runs_sanitized:run", timeout=300)
    assert int(printed.split()[-1]) == ROUNDS


def run(library: str) -> None:
    """In the sanitized child: the search on random batches against numpy, then the rounds run."""
    runs = load(library, "_runs")
    rng = np.random.default_rng(23)
    for i in range(ROUNDS):
        n = int(rng.integers(0, 3_000)) * (i % 5 != 0)  # a fifth of the rounds with no rows
        if i % 3 == 0:  # anywhere in int64, its ends included
            times = rng.integers(INT64.min, INT64.max, n, dtype=np.int64)
            times[rng.random(n) < 0.05] = INT64.min
            times[rng.random(n) < 0.05] = INT64.max
        else:  # series after series, each in time order, around 1970
            times = np.sort(rng.integers(-40 * DAY, 40 * DAY, n)).astype(np.int64)
            times = np.concatenate([np.sort(part) for part in np.array_split(times, int(rng.integers(1, 8)))]) if n else times
        series = np.repeat(rng.integers(0, 5, 8), -(-n // 8))[:n].astype(np.int32) if i % 2 else None
        width = int(rng.choice([1, 3, 3_600_000_000, DAY, INT64.max]))
        buckets = np.floor_divide(times, width)
        change = buckets[1:] != buckets[:-1]
        if series is not None:
            change |= series[1:] != series[:-1]
        expected = np.append(0, np.flatnonzero(change) + 1) if n else np.zeros(0, dtype=np.int64)
        limit = int(rng.integers(0, len(expected) + 3))
        out = np.full(max(0, min(n, limit)), -7, dtype=np.int64)
        count, lowest, highest = runs.runs(times, width, series, out, limit)
        if len(expected) <= limit:
            assert count == len(expected) and out[:count].tolist() == expected.tolist(), (i, width, limit)
        else:
            assert count == -1, (i, count, len(expected), limit)
        assert (lowest, highest) == ((int(times.min()), int(times.max())) if n else (0, 0))
    for width, limit in ((0, 1), (1, -1)):
        try:
            runs.runs(np.zeros(3, dtype=np.int64), width, None, np.zeros(3, dtype=np.int64), limit)
        except ValueError as e:
            assert "width must be positive and limit not negative" in str(e)
        else:
            raise AssertionError(f"width {width} and limit {limit} were taken")
    for i in range(ROUNDS):  # runs laid end to end: empty ones, long ones, starts near int64's ends
        n = int(rng.integers(0, 40))
        sizes = rng.integers(0, 300, n) * (rng.random(n) < 0.8)
        starts = rng.integers(INT64.min, INT64.max, n, dtype=np.int64) if i % 4 == 0 else rng.integers(0, 10**6, n)
        got = runs.ranges(starts, sizes, np.full(int(sizes.sum()), -7, dtype=np.int64))
        expected = [(int(a) + k + 2**63) % 2**64 - 2**63 for a, size in zip(starts, sizes, strict=True) for k in range(size)]
        assert got.tolist() == expected, i
    for i in range(ROUNDS):  # runs of equal values, int32 and int64, every limit from none to more than there are
        n = int(rng.integers(0, 2_000)) * (i % 7 != 0)
        values = np.repeat(rng.integers(-3, 3, n), rng.integers(1, 9, n))[:n].astype(np.int64 if i % 2 else np.int32)
        expected = np.append(0, np.flatnonzero(values[1:] != values[:-1]) + 1) if n else np.zeros(0, dtype=np.int64)
        limit = int(rng.integers(0, len(expected) + 3))
        out = np.full(min(n, limit), -7, dtype=np.int64)
        count = runs.starts(values, out, limit)
        if len(expected) <= limit:
            assert count == len(expected) and out[:count].tolist() == expected.tolist(), (i, limit)
        else:
            assert count == -1, (i, count, len(expected), limit)
    for i in range(ROUNDS):  # sums per code, int32 and int64, weighted or counted, a code outside refused
        n, slots = int(rng.integers(0, 3_000)) * (i % 7 != 0), int(rng.integers(1, 400))
        codes = rng.integers(0, slots, n).astype(np.int64 if i % 2 else np.int32)
        if i % 4 == 1:  # in runs of one code, which are summed a run at a time
            codes = np.repeat(codes, rng.integers(1, 9, n))[:n]
        weights = rng.normal(size=n) if i % 3 else None
        out = np.zeros(slots)
        runs.tally(codes, out, weights)
        assert np.allclose(out, np.bincount(codes, weights=weights, minlength=slots)), i
        if n:
            codes[int(rng.integers(0, n))] = slots if i % 2 else -1
            try:
                runs.tally(codes, np.zeros(slots), weights)
            except ValueError as e:
                assert "outside" in str(e)
            else:
                raise AssertionError(f"a code outside [0, {slots}) was taken")
    for sizes, room in (([3, -1], 2), ([3, 1], 3), ([3, 1], 9)):
        try:
            runs.ranges(np.zeros(2, dtype=np.int64), np.array(sizes, dtype=np.int64), np.zeros(room, dtype=np.int64))
        except ValueError as e:
            assert "negative" in str(e) or "out holds" in str(e)
        else:
            raise AssertionError(f"sizes {sizes} into {room} were taken")
    print(ROUNDS)
