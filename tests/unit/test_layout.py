"""The counting unique used on every scanned batch agrees with numpy's sorting one."""

from __future__ import annotations

import numpy as np
import pytest

from timelake.layout import dense_unique


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).integers(19_000, 19_060, 250_000),  # days of a batch: the counting path
    np.array([3, 3, -2, 7, 7, 7]),
    np.array([5]),
    np.random.default_rng(1).integers(-10**12, 10**12, 1_000),  # sparse: falls back to sorting
    np.zeros(0),
])
def test_dense_unique_equals_numpy_unique(values):
    values = values.astype(np.int64)
    got = dense_unique(values)
    expected = np.unique(values, return_inverse=True, return_counts=True)
    for a, b in zip(got, expected, strict=True):
        assert np.array_equal(a, b)
