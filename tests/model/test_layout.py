"""The counting unique used on every scanned batch agrees with numpy's sorting one."""

from __future__ import annotations

import numpy as np
import pytest

from timelake.model.layout import dense_unique


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).integers(19_000, 19_060, 250_000),  # days of a batch: the counting path
    np.array([3, 3, -2, 7, 7, 7]),
    np.array([5]),
    np.full(100_000, 19_723),  # a batch of one day: nothing counted
    np.random.default_rng(1).integers(-10**12, 10**12, 1_000),  # sparse: falls back to sorting
    np.zeros(0),
])
def test_dense_unique_equals_numpy_unique(values):
    values = values.astype(np.int64)
    got = dense_unique(values)
    expected = np.unique(values, return_inverse=True, return_counts=True)
    for a, b in zip(got, expected, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("codes", [np.array([0, 0, 1, 1, 1, 3]), np.array([1, 0, 3, 1, 0, 1])])
def test_split_by_code_groups_rows_in_their_order_sorted_or_not(codes):
    import pyarrow as pa

    from timelake.model.layout import split_by_code

    table = pa.table({"row": np.arange(len(codes))})
    groups = split_by_code(table, codes)
    assert [code for code, _ in groups] == sorted(set(codes.tolist()))
    for code, rows in groups:
        assert rows.column("row").to_pylist() == np.flatnonzero(codes == code).tolist()
