"""The counting unique used on every scanned batch, and the run-aware stable sort used on every unit,
agree with numpy's sorting ones; a planned range's pieces hold exactly main's rows in them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from timelake.adapters.objects import ArrowObjects
from timelake.model.layout import (
    COUNTED_RANGE,
    RUN_ROWS,
    MainReader,
    SnapshotRange,
    by_index,
    concat_ranges,
    dense_unique,
    gather,
    micros,
    split_by_code,
    stable_argsort,
    tally,
    time_runs,
)


DAY, HOUR = 86_400_000_000, 3_600_000_000
RNG = np.random.default_rng(5)


@pytest.mark.parametrize(("times", "series"), [
    (np.tile(np.arange(0, 3 * DAY, 60_000_000), 4), np.repeat(np.arange(4, dtype=np.int32), 3 * 1440)),  # a file a device
    (np.repeat(np.arange(-2 * DAY, DAY, 60_000_000), 5), np.tile(np.arange(5, dtype=np.int32), 3 * 1440)),  # time-ordered
    (np.sort(RNG.integers(-5 * DAY, 5 * DAY, 10_000)), None),  # before and after 1970, no series
    (RNG.integers(-(2**62), 2**62, 1_000), RNG.integers(0, 3, 1_000).astype(np.int32)),  # no order at all
    (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)),
])
@pytest.mark.parametrize("width", [HOUR, DAY])
@pytest.mark.parametrize("limit", [None, 40, 0])
def test_runs_found_compiled_equal_numpys(monkeypatch, times, series, width, limit):
    """The compiled search and numpy's find the same runs of one time bucket and series, or both find more
    than the limit; and the same bounds."""
    from timelake.model import layout

    times = times.astype(np.int64)
    compiled = time_runs(times, width, series, limit)
    monkeypatch.setattr(layout, "_runs", None)
    plain = time_runs(times, width, series, limit)
    assert (compiled.starts is None) == (plain.starts is None)
    if plain.starts is not None:
        assert compiled.starts.tolist() == plain.starts.tolist()
    assert (compiled.lowest, compiled.highest) == (plain.lowest, plain.highest)
    bucket = np.floor_divide(times, width)
    if len(times) and plain.starts is not None:  # every run is of one bucket and series, its neighbours not
        ends = np.append(plain.starts[1:], len(times))
        assert all((bucket[a:b] == bucket[a]).all() for a, b in zip(plain.starts, ends, strict=True))


@pytest.mark.parametrize("order", ["scattered", "sorted", "runs"])
@pytest.mark.parametrize("code_type", [np.int32, np.int64, np.int16])
@pytest.mark.parametrize("weighted", [True, False])
def test_sums_per_code_equal_numpys_bincount(monkeypatch, code_type, weighted, order):
    """Per-slot sums of rows' weights (or their count) as `tally` gives them, compiled or not, equal numpy's
    bincount: slots no row names stay zero, int16 codes take numpy's way. Codes in order (a staged file's
    series) and in runs that come back (a few series at a time) are summed a run at a time, the same."""
    codes = RNG.integers(0, 40, 5_000)
    if order == "sorted":
        codes.sort()
    elif order == "runs":
        codes = np.repeat(RNG.integers(0, 40, 700), RNG.integers(1, 15, 700))[:5_000]
    codes = codes.astype(code_type)
    weights = RNG.normal(size=len(codes)) if weighted else None
    expected = np.bincount(codes, weights=weights, minlength=50)
    compiled = tally(codes, 50, weights)
    from timelake.model import layout

    monkeypatch.setattr(layout, "_runs", None)
    plain = tally(codes, 50, weights)
    assert compiled.dtype == plain.dtype == np.float64
    assert np.allclose(compiled, expected) and np.allclose(plain, expected) and (compiled[40:] == 0).all()


def test_the_compiled_search_names_the_argument_it_refuses():
    from timelake.model import _runs

    times = np.arange(10, dtype=np.int64)
    with pytest.raises(TypeError, match="series must be a contiguous int32 array"):
        _runs.runs(times, DAY, times, np.empty(10, dtype=np.int64), 10)
    with pytest.raises(ValueError, match="out must hold 10 entries"):
        _runs.runs(times, DAY, None, np.empty(3, dtype=np.int64), 20)
    with pytest.raises(TypeError, match="sizes must be a contiguous int64 array"):
        _runs.ranges(times, times.astype(np.int32), np.empty(45, dtype=np.int64))
    with pytest.raises(ValueError, match=r"sizes\[1\] is negative \(-2\)"):
        _runs.ranges(times[:3], np.array([4, -2, 1]), np.empty(10, dtype=np.int64))
    with pytest.raises(ValueError, match="out holds 2 entries, fewer than the sizes' sum"):
        _runs.ranges(times[:2], np.array([1, 2]), np.empty(2, dtype=np.int64))
    with pytest.raises(ValueError, match="out holds 9 entries, not the sizes' sum 3"):
        _runs.ranges(times[:2], np.array([1, 2]), np.empty(9, dtype=np.int64))
    with pytest.raises(ValueError, match="as long as each other, not 3 and 2"):
        _runs.ranges(times[:3], np.array([1, 2]), np.empty(3, dtype=np.int64))
    with pytest.raises(TypeError, match="values must be a contiguous int32 or int64 array"):
        _runs.starts(times.astype(np.float64), np.empty(10, dtype=np.int64), 10)
    with pytest.raises(ValueError, match=r"codes\[3\] is 9, outside \[0, 5\)"):
        _runs.tally(np.array([0, 4, 2, 9, 1], dtype=np.int32), np.zeros(5))
    counted, summed = np.zeros(5), np.zeros(5)
    for out, weights in ((counted, None), (summed, np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0]))):
        with pytest.raises(ValueError, match=r"codes\[4\] is 5, outside"):  # the run before it is added, not lost
            _runs.tally(np.array([0, 2, 2, 2, 5, 1], dtype=np.int64), out, weights)
    assert counted.tolist() == [1, 0, 3, 0, 0] and summed.tolist() == [0.5, 0, 7.0, 0, 0]
    with pytest.raises(ValueError, match=r"codes\[0\] is -1, outside"):
        _runs.tally(np.array([-1], dtype=np.int64), np.zeros(5))
    with pytest.raises(TypeError, match="out and weights must be contiguous float64 arrays"):
        _runs.tally(times, np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="weights must hold one value a code: 10, not 3"):
        _runs.tally(times, np.zeros(10), np.zeros(3))
    with pytest.raises(ValueError, match="out must hold 4 entries, not 2"):
        _runs.starts(times, np.empty(2, dtype=np.int64), 4)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_runs_are_found_up_to_a_limit(monkeypatch, compiled, dtype):
    """Where runs of equal values start, or None past the limit: values that change every row are given
    up on at the limit, long runs are all found."""
    from timelake.model import layout

    if not compiled:
        monkeypatch.setattr(layout, "_runs", None)
    rng = np.random.default_rng(11)
    runs = np.repeat(rng.integers(0, 5, 40), rng.integers(1, 600, 40)).astype(dtype)
    expected = layout.run_starts(runs)
    for limit in (len(expected), len(expected) + 1, 10**6):
        got = layout.run_starts_within(runs, limit)
        assert got is not None and (got.dtype, got.tolist()) == (np.int64, expected.tolist())
    assert layout.run_starts_within(runs, len(expected) - 1) is None
    assert layout.run_starts_within(rng.integers(0, 300, 5000).astype(dtype), 19) is None
    assert layout.run_starts_within(np.array([7], dtype=dtype), 1).tolist() == [0]


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).integers(19_000, 19_060, 250_000),  # days of a batch: the counting path
    np.array([3, 3, -2, 7, 7, 7]),
    np.array([5]),
    np.full(100_000, 19_723),  # a batch of one day: nothing counted
    np.concatenate([np.repeat(np.arange(19_000, 19_120), 1440), np.repeat(np.arange(19_000, 19_062), 1440)]),  # runs
    np.repeat(np.random.default_rng(2).integers(-50, 50, 400), 300),  # runs repeating values, in no order
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
    table = pa.table({"row": np.arange(len(codes))})
    groups = split_by_code(table, codes)
    assert [code for code, _ in groups] == sorted(set(codes.tolist()))
    for code, rows in groups:
        assert rows.column("row").to_pylist() == np.flatnonzero(codes == code).tolist()


@pytest.mark.parametrize("order", [np.array([4, 0, 0, 3]), np.arange(5, dtype=np.uint32)[::-1], np.zeros(0, dtype=np.int64)])
def test_gather_takes_the_rows_arrows_checked_take_does(order):
    table = pa.table({"row": np.arange(5), "name": pa.array(list("abcde")).dictionary_encode()})
    assert gather(table, order).equals(table.take(pa.array(order)))


@pytest.mark.parametrize("order", [np.array([0, 5]), np.array([-1, 2]), np.array([2**40])])
def test_gather_refuses_a_row_the_table_lacks_as_arrow_does(order):
    table = pa.table({"row": np.arange(5)})
    with pytest.raises(IndexError, match=f"row {order[0] if order[0] < 0 else order[-1]} is not among the 5 rows"):
        gather(table, order)
    with pytest.raises(IndexError):
        table.take(pa.array(order))


def test_by_index_leaves_a_null_null_whatever_its_index_slot_holds():
    """A null's index slot may hold anything (here two billion): the take without Arrow's check must not read it."""
    slots = np.array([0, 2_000_000_000, 2, 1], dtype=np.int32)
    valid = pa.py_buffer(np.packbits(np.array([1, 0, 1, 1], dtype=np.uint8), bitorder="little").tobytes())
    indices = pa.Array.from_buffers(pa.int32(), 4, [valid, pa.py_buffer(slots.tobytes())], null_count=1)
    column = pa.DictionaryArray.from_arrays(indices, pa.array(["a", "b", "c"]))
    assert by_index(np.array([10, 20, 30]), column).to_pylist() == [10, None, 30, 20]
    with pytest.raises(IndexError, match="2 values for a dictionary of 3"):
        by_index(np.array([10, 20]), column)


def _runs(rng: np.random.Generator, values: np.ndarray, mean: int) -> np.ndarray:
    """``values`` repeated in runs of about ``mean`` rows, as a unit's series ranks arrive from the spill
    of files per series: a value may have several runs, not next to each other."""
    sizes = rng.integers(1, 2 * mean, len(values))
    return np.repeat(values, sizes)


@pytest.mark.parametrize("keys", [
    _runs(np.random.default_rng(2), np.random.default_rng(3).permutation(300), 1440),  # the run path, ranks < 2**16
    _runs(np.random.default_rng(4), np.random.default_rng(5).integers(0, 50, 400), 900),  # repeated values, runs apart
    _runs(np.random.default_rng(6), np.random.default_rng(7).integers(-10**12, 10**12, 200), 2000),  # wide keys
    np.full(100_000, 7),  # one run
    np.tile(np.arange(300), 1440),  # interleaved, a narrow range: Arrow's counting sort
    np.tile(np.arange(300, dtype=np.int32)[::-1], 1440),  # the same as int32 ranks are
    np.random.default_rng(10).integers(-5000, -5000 + COUNTED_RANGE, 50_000),  # the widest range counted, negative
    np.random.default_rng(11).integers(0, 30_000, 50_000),  # too wide to count: numpy's radix sort as uint16
    np.random.default_rng(12).integers(2**40, 2**40 + 100, 50_000).astype(np.uint64),  # unsigned, counted
    np.random.default_rng(8).integers(0, 1 << 20, 100_000),  # no runs, wide: numpy's own stable sort
    _runs(np.random.default_rng(9), np.arange(3), RUN_ROWS)[: 2 * RUN_ROWS - 1],  # too short to look for runs
    np.zeros(0, dtype=np.int64),
])
def test_stable_argsort_equals_numpy_stable_sort(keys):
    got = stable_argsort(keys)
    assert got.dtype == np.int64
    assert got.flags.writeable  # callers drop rows from the order in place
    assert np.array_equal(got, np.argsort(keys, kind="stable"))


@pytest.mark.parametrize(("starts", "sizes"), [([5, 0, 9], [2, 3, 1]), ([4, 7, 1], [0, 2, 0]), ([], []), ([3], [0]),
                                               ([9, 30, 2, 2, 0], [0, 4, 0, 3, 1]), ([1_000_000, 7], [2, 5])])
@pytest.mark.parametrize("compiled", [True, False])
def test_concat_ranges_lays_ranges_end_to_end(monkeypatch, starts, sizes, compiled):
    if not compiled:
        from timelake.model import layout

        monkeypatch.setattr(layout, "_runs", None)
    expected = [i for start, size in zip(starts, sizes, strict=True) for i in range(start, start + size)]
    got = concat_ranges(np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64))
    assert (got.dtype, got.tolist()) == (np.int64, expected)


def test_a_snapshot_range_gives_the_rows_of_a_piece_whether_its_files_lie_inside_it_or_across_it(sensor, readings):
    """A piece read from a planned range holds exactly main's rows in [start, end): a day's file inside
    the piece is taken whole (no row filter) and a piece that cuts files filters their rows."""
    rows = readings("2026-01-01", days=2, devices=3, step_minutes=30)
    sensor.append(rows, evaluate_rules=False)
    sensor.append(rows.slice(0, 2), evaluate_rules=False)  # a second file in the first day
    day = 86_400_000_000
    first = int(micros(rows, "ts").min())
    iceberg = sensor.iceberg.refresh()
    planned = SnapshotRange(iceberg, "ts", first, first + 2 * day, ("device_id", "ts", "value"), objects=ArrowObjects())
    times = micros(rows, "ts")
    for lo, hi in [(first, first + day), (first + day, first + 2 * day), (first + day // 2, first + day + day // 3)]:
        got = planned.batches(lo, hi, ("device_id",)).read_all()
        assert sorted(micros(got, "ts").tolist()) == sorted([t for t in [*times, *times[:2]] if lo <= t < hi])
        assert pa.types.is_dictionary(got.schema.field("device_id").type)


def test_a_main_reader_plans_each_snapshot_once_and_reads_each_writers_own(lake, sensor, readings, monkeypatch):
    """Writers (scan tasks, units) sharing a main reader that loaded main before and after a live commit read
    their own snapshot's rows, each snapshot planned once however they take turns."""
    from timelake.model import layout

    made = []

    class Counted(SnapshotRange):
        def __init__(self, *args, **kwargs) -> None:
            made.append(args[5])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(layout, "SnapshotRange", Counted)
    rows = readings("2026-01-01", days=2, devices=3, step_minutes=30)
    sensor.append(rows, evaluate_rules=False)
    before = lake.runtime.load_table("iot.sensor")  # as a task loaded it
    sensor.append(readings("2026-01-02", days=1, devices=2, step_minutes=60, seed=5), evaluate_rules=False)  # a live commit
    after = lake.runtime.load_table("iot.sensor")
    day, first = 86_400_000_000, int(micros(rows, "ts").min())
    reader = MainReader("ts", first, first + 2 * day, ("device_id", "ts", "value"), objects=ArrowObjects(),
                        dictionaries=("device_id",))
    snapshots = [before.current_snapshot().snapshot_id, after.current_snapshot().snapshot_id]
    assert snapshots[0] != snapshots[1]
    expected = {}
    for table in (before, after):
        scanned = table.scan(row_filter=layout.time_filter("ts", first + day, first + 2 * day)).to_arrow()
        expected[table.current_snapshot().snapshot_id] = sorted(zip(scanned["device_id"].to_pylist(),
                                                                    micros(scanned, "ts").tolist(), strict=True))
    for table in (before, after, before, after, before):
        got = reader.batches(table, first + day, first + 2 * day).read_all()
        keys = sorted(zip(got["device_id"].cast(pa.string()).to_pylist(), micros(got, "ts").tolist(), strict=True))
        assert keys == expected[table.current_snapshot().snapshot_id]
    assert made == snapshots


def test_planning_main_without_residuals_finds_the_files_and_deletes_pyicebergs_own_planning_finds(sensor, readings):
    """Main is planned without a residual filter per file: the same data files, with the same delete files,
    as pyiceberg's planning of the range; each task's residual is the whole filter."""
    from pyiceberg.expressions import EqualTo

    from timelake.model.layout import time_filter
    from timelake.model.lineage import main_tasks

    rows = readings("2026-01-01", days=4, devices=3, step_minutes=60)
    sensor.append(rows, evaluate_rules=False)
    sensor.append(rows.slice(0, 5), evaluate_rules=False)
    iceberg = sensor.iceberg.refresh()
    iceberg.delete(EqualTo("device_id", "d01"))  # a delete: files rewritten, or delete files where they apply
    iceberg = iceberg.refresh()
    day = 86_400_000_000
    first = int(micros(rows, "ts").min())
    row_filter = time_filter("ts", first + day, first + 3 * day)
    ours = main_tasks(iceberg, row_filter)
    theirs = list(iceberg.scan(row_filter=row_filter).plan_files())
    assert len(ours) == 2 and len(theirs) == 2  # the two middle days of four
    assert sorted((t.file.file_path, sorted(d.file_path for d in t.delete_files)) for t in ours) == \
        sorted((t.file.file_path, sorted(d.file_path for d in t.delete_files)) for t in theirs)
    assert all(t.residual == row_filter for t in ours)
