"""The compiled key match built with AddressSanitizer and UndefinedBehaviorSanitizer, on random inputs.

The test compiles ``_keymatch.c`` as the install does, plus the sanitizers, and runs its six functions
in a child interpreter that loads the ASan runtime first (it must come before any other library) on
random arrays of every length from none to a few thousand: keys spanning the whole int64 range with
repeats, keys of interleaved series each in time order, sort codes in key order (and shuffled, which it
must answer within bounds) against rows in any order with unknown, negative and looked-up series, codes
with and without a lookup (unknown and negative codes, times before and past the range, the widest time
field), sorted keys with repeats and a row out of order (series codes of both widths, times over all of int64), orders with marked entries
anywhere and rows of both value types, each checked against numpy. Any report of either sanitizer stops
the child with an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.sanitized import ROOT, load, run_sanitized

SOURCE = ROOT / "layers" / "timelake" / "steps" / "_keymatch.c"
ROUNDS = 300


def test_compiled_key_match_is_clean_under_both_sanitizers(tmp_path: Path) -> None:
    printed = run_sanitized(SOURCE, tmp_path, "tests.steps.test_keymatch_sanitized:run", timeout=300)
    assert int(printed.split()[-1]) == ROUNDS


def run(library: str) -> None:
    """In the sanitized child: every function on random inputs against numpy, then the rounds run."""
    keymatch = load(library, "_keymatch")
    rng = np.random.default_rng(17)
    for i in range(ROUNDS):
        n, m = (int(x) for x in rng.integers(0, 3_000, 2) * (i % 3 != 0))  # a third of the rounds with an empty side
        pool = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, max(n + m, 1) // 2 + 1, dtype=np.int64)
        mine, theirs = np.sort(rng.choice(pool, n)), np.sort(rng.choice(pool, m))
        mask = np.zeros(n, dtype=bool)
        assert keymatch.mark(mine, theirs, mask) == np.isin(mine, theirs).sum() and (mask == np.isin(mine, theirs)).all()

        series = int(rng.integers(1, 40))
        interleaved = (rng.integers(0, series, m) << 20) | np.sort(rng.integers(0, 1 << 20, m))
        ordered = np.empty_like(interleaved)
        countable = m > 0 and int(interleaved.max() >> 20) < m  # as many series as keys at most
        assert keymatch.by_series(interleaved, 20, ordered) == countable
        assert not countable or (ordered == np.sort(interleaved)).all()

        count = int(rng.integers(0, 12))
        ranks = np.sort(rng.integers(0, max(count, 1), n * (count > 0))).astype(np.int32 if i % 2 else np.int64)
        keyed = np.concatenate([np.sort(rng.integers(-50, 50, int((ranks == r).sum()))) for r in range(count)] or [np.zeros(0)])
        keyed = keyed.astype(np.int64)
        table = rng.integers(-1, count + 2, int(rng.integers(0, 6)), dtype=np.int64) if i % 3 == 1 else None
        their_codes = rng.integers(-2, count + 3, m).astype(np.int32 if i % 4 < 2 else np.int64)
        their_times = rng.integers(-50, 50, m, dtype=np.int64)
        their_ranks = their_codes.astype(np.int64)
        if table is not None:
            known = (their_ranks >= 0) & (their_ranks < len(table))
            their_ranks = np.where(known, table[np.clip(their_ranks, 0, max(len(table) - 1, 0))] if len(table) else -1, -1)
        held = set(zip(their_ranks.tolist(), their_times.tolist(), strict=True))
        expected = np.array([(r, t) in held for r, t in zip(ranks.tolist(), keyed.tolist(), strict=True)], dtype=bool)
        found = np.zeros(len(keyed), dtype=bool)
        assert keymatch.meet(ranks, keyed, count, their_codes, their_times, found, table) == expected.sum()
        assert (found == expected).all()
        shuffled = rng.permutation(len(keyed))  # keys out of order: answered wrongly, but within bounds
        keymatch.meet(ranks[shuffled], keyed[shuffled], count, their_codes, their_times, found, table)

        bits = int(rng.integers(1, 60))  # ranks below 8 take 3 bits more: a packer never fits past 63
        base = int(rng.integers(-(1 << 40), 1 << 40))
        span = 1 << min(bits, 61)
        times = base + rng.integers(-(span // 4) - 2, span + span // 4 + 2, n, dtype=np.int64)
        lookup = rng.integers(-1, 4, int(rng.integers(0, 6)), dtype=np.int64) if i % 2 else None
        codes = rng.integers(-2, 8, n).astype(np.int32 if i % 4 < 2 else np.int64)
        out = np.empty(n, dtype=np.int64)
        outside = keymatch.pack(codes, times, base, bits, out, lookup)
        ranks = codes.astype(np.int64)
        if lookup is not None:
            known = (ranks >= 0) & (ranks < len(lookup))
            ranks = np.where(known, lookup[np.clip(ranks, 0, max(len(lookup) - 1, 0))] if len(lookup) else -1, -1)
        low = (times.astype(object) - base) if n else np.zeros(0, dtype=object)
        inside = np.array([r >= 0 and 0 <= x < (1 << bits) for r, x in zip(ranks.tolist(), low.tolist(), strict=True)], dtype=bool)
        assert outside == (~inside).sum() and (out[~inside] == -1).all()
        assert out[inside].tolist() == [(r << bits) | x for r, x in zip(ranks[inside].tolist(), low[inside].tolist(), strict=True)]

        first = np.sort(rng.integers(-3, 3, n)).astype(np.int32 if i % 2 else np.int64)
        second = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64) if i % 3 == 0 else \
            np.concatenate([np.sort(rng.integers(0, 9, int((first == s).sum()))) for s in range(-3, 3)]).astype(np.int64)
        if n > 1 and i % 4 == 0:  # a row out of order
            at = int(rng.integers(0, n - 1))
            first[at], first[at + 1] = first[at + 1], first[at]
        repeats = np.ones(n, dtype=bool)
        less = (first[:-1] < first[1:]) | ((first[:-1] == first[1:]) & (second[:-1] < second[1:]))
        equal = (first[:-1] == first[1:]) & (second[:-1] == second[1:])
        bad = np.flatnonzero(~(less | equal))
        assert keymatch.ordered(first, second, repeats) == (int(bad[0]) + 1 if len(bad) else -1, int(equal.sum()))
        assert repeats.tolist() == (equal.tolist() + [False] if n else [])

        order = rng.permutation(n).astype(np.int64)
        marked = rng.random(n) < rng.random()
        values = rng.normal(size=n) if i % 2 else rng.integers(-1_000, 1_000, n)
        expected = order[~marked].tolist(), float(values[order[marked]].sum()) if n else 0.0
        kept, total = keymatch.drop(order, marked, values if i % 5 else None, n)
        assert order[:kept].tolist() == expected[0]
        assert abs(total - (expected[1] if i % 5 else 0.0)) <= 1e-6 * max(1.0, float(np.abs(values).sum()) if n else 1.0)
    print(ROUNDS)
