"""Sorting, source dedup and the merge-mode key match of a unit, against plain references."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_readings, recent
from timelake.model.contract import Contract
from timelake.steps import _keymatch, write
from timelake.steps.write import KeyPacker, _drop_marked, _sort_and_dedup, drop_existing, existing_mask, meets, met, sorted_order


@pytest.fixture(params=["compiled", "numpy"])
def walk(request, monkeypatch):
    """The merge match both ways: the compiled walk over two sorted arrays, and numpy's search without it
    (an install with no C compiler, and the Lambda layers)."""
    if request.param == "numpy":
        monkeypatch.setattr(write, "_keymatch", None)
    return request.param


def _contract(series: tuple[str, ...] = ("device_id",)) -> Contract:
    return Contract("ts", series, (*series, "ts"), None, (), 1, "value")


def _reference_mask(rows: pa.Table, existing: pa.Table, keys: list[str]) -> np.ndarray:
    have = set(zip(*(existing.column(k).to_pylist() for k in keys), strict=True))
    return np.array([key in have for key in zip(*(rows.column(k).to_pylist() for k in keys), strict=True)])


def test_merge_match_equals_a_set_reference_with_unknown_series_and_shared_times():
    rows = make_readings("2026-01-01", days=0.5, devices=5, step_minutes=10)
    rng = np.random.default_rng(1)
    existing = rows.take(pa.array(rng.choice(rows.num_rows, 40, replace=False)))
    strangers = make_readings("2026-01-01", days=0.5, devices=9, step_minutes=10).filter(
        pa.array([d >= "d05" for d in make_readings("2026-01-01", days=0.5, devices=9, step_minutes=10).column("device_id").to_pylist()]))
    existing = pa.concat_tables([existing, strangers]).select(["device_id", "ts"])
    kept, dropped, dropped_sum = drop_existing(rows, existing, _contract())
    mask = _reference_mask(rows, existing, ["device_id", "ts"])
    assert dropped == mask.sum() == 40 and kept.num_rows == rows.num_rows - 40
    assert dropped_sum == pytest.approx(sum(v for v, m in zip(rows.column("value").to_pylist(), mask, strict=True) if m))


def test_merge_match_with_a_two_column_series_key_takes_the_join():
    rows = make_readings("2026-01-01", days=0.25, devices=4, step_minutes=15)
    rows = rows.append_column("site", pa.array(["a", "b"] * (rows.num_rows // 2)))
    existing = rows.slice(0, 7).select(["device_id", "site", "ts"])
    existing = existing.set_column(1, "site", pa.array(["a", "a", "a", "b", "b", "b", "b"]))
    kept, dropped, _ = drop_existing(rows, existing, _contract(("device_id", "site")))
    assert dropped == _reference_mask(rows, existing, ["device_id", "site", "ts"]).sum()
    batches = iter(existing.to_batches(max_chunksize=3))
    assert existing_mask(rows, batches, _contract(("device_id", "site"))).tolist() == \
        _reference_mask(rows, existing, ["device_id", "site", "ts"]).tolist()


def test_sort_and_dedup_keeps_the_last_row_of_each_key():
    rows = make_readings("2026-01-01", days=0.1, devices=3, step_minutes=5)
    shuffled = rows.take(pa.array(np.random.default_rng(2).permutation(rows.num_rows)))
    corrections = rows.slice(0, 4).set_column(2, "value", pa.array([-1.0, -2.0, -3.0, -4.0]))
    out, dup_sum, duplicates, _ = _sort_and_dedup(pa.concat_tables([shuffled, corrections]), _contract())
    assert duplicates == 4 and out.num_rows == rows.num_rows
    assert out.equals(out.sort_by([("device_id", "ascending"), ("ts", "ascending")]))
    assert sorted(out.column("value").to_pylist()[:2]) == [-2.0, -1.0]
    assert dup_sum == pytest.approx(sum(rows.slice(0, 4).column("value").to_pylist()))


@pytest.mark.parametrize("order", ["time_major", "series_major", "one_late_row", "shuffled"])
@pytest.mark.parametrize("extra_key", [False, True], ids=["series_time", "series_time_site"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_sort_and_dedup_equals_a_stable_lexicographic_sort_in_any_source_order(monkeypatch, order, extra_key, compiled):
    """The sort takes a shortcut when rows come in time order within each series (one stable sort by
    series); whatever the order, the kept rows and their order must be those of a stable sort by the
    whole key that keeps the last source row of each key, whether the compiled pass or numpy checks the
    order."""
    if not compiled:
        monkeypatch.setattr(write, "_keymatch", None)
    rng = np.random.default_rng(4)
    rows = make_readings("2026-01-01", days=0.2, devices=7, step_minutes=5)
    rows = rows.append_column("site", pa.array(rng.choice(["x", "y"], rows.num_rows)))
    rows = pa.concat_tables([rows, rows.take(pa.array(rng.choice(rows.num_rows, 30)))])  # repeated keys
    rows = rows.set_column(2, "value", pa.array(np.arange(rows.num_rows, dtype=np.float64)))  # tells rows apart
    series = rows.column("device_id").to_numpy(zero_copy_only=False)
    ts = rows.column("ts").cast(pa.int64()).to_numpy()
    if order == "series_major":
        rows = rows.take(pa.array(np.lexsort((ts, series))))
    elif order == "one_late_row":
        rows = rows.take(pa.array(np.concatenate([np.arange(1, rows.num_rows), [0]])))
    elif order == "shuffled":
        rows = rows.take(pa.array(rng.permutation(rows.num_rows)))
    keys = ["device_id", "ts", "site"] if extra_key else ["device_id", "ts"]
    contract = Contract("ts", ("device_id",), tuple(keys), None, (), 1, "value")
    out, _, duplicates, _ = _sort_and_dedup(rows, contract)
    expected: dict[tuple, float] = {}
    for row in rows.to_pylist():  # the last source row of a key wins
        expected[tuple(row[k] for k in keys)] = row["value"]
    assert duplicates == rows.num_rows - len(expected)
    assert [tuple(r[k] for k in keys) for r in out.to_pylist()] == sorted(expected)
    assert out.column("value").to_pylist() == [expected[k] for k in sorted(expected)]


@pytest.mark.parametrize("first_type", [np.int32, np.int64])
def test_the_compiled_order_check_equals_numpys(monkeypatch, first_type):
    """Keys in order, with repeats, with a row out of order in either column, one row and none: the
    compiled pass and numpy find the same first row out of order and the same repeats."""
    rng = np.random.default_rng(9)
    series = np.sort(rng.integers(0, 6, 2_000)).astype(first_type)
    times = np.concatenate([np.sort(rng.integers(0, 50, (series == s).sum())) for s in range(6)]).astype(np.int64)
    late_time, late_series = times.copy(), series.copy()
    late_time[700] = late_time[699] - 1 if late_time[699] > 0 else -1
    late_series[1500], late_series[1501] = late_series[1501] + 1, late_series[1500]
    cases = [(series, times), (late_time * 0 + series, late_time), (late_series, times), (series[:1], times[:1]),
             (series[:0], times[:0])]
    for first, second in cases:
        compiled = write.in_order([first, second])
        monkeypatch.setattr(write, "_keymatch", None)
        plain = write.in_order([first, second])
        monkeypatch.undo()
        assert compiled[0] == plain[0] and compiled[1].tolist() == plain[1].tolist()
    assert write.in_order([late_series, times])[0] is not None and write.in_order([series, late_time])[0] == 700


@pytest.mark.parametrize("rows_order", ["table_order", "shuffled", "with_repeats"])
@pytest.mark.parametrize("existing_order", ["sorted", "time_order", "shuffled"])
@pytest.mark.parametrize("with_codes", [True, False], ids=["codes", "no_codes"])
@pytest.mark.parametrize("existing_as", ["table", "batches"])
def test_existing_mask_equals_a_set_reference_for_any_row_order(rows_order, existing_order, with_codes, existing_as, walk):
    """The rows' keys are packed and sorted once; the existing keys are looked up among them, as a table or
    as batches read one at a time (main in merge mode). Rows in any order, or repeating a key (every
    repeat matches), must give the reference."""
    rng = np.random.default_rng(3)
    rows = make_readings("2026-01-01", days=0.5, devices=6, step_minutes=10)
    sorted_rows, _, _, codes = _sort_and_dedup(rows, _contract())
    existing = make_readings("2026-01-01", days=0.5, devices=9, step_minutes=5).select(["device_id", "ts"])
    existing = existing.take(pa.array(np.sort(rng.choice(existing.num_rows, 300, replace=False))))
    if existing_order == "shuffled":
        existing = existing.take(pa.array(rng.permutation(existing.num_rows)))
    elif existing_order == "time_order":  # as live writers leave main: each series ascends, the keys do not
        existing = existing.sort_by([("ts", "ascending"), ("device_id", "ascending")])
    if rows_order == "table_order":
        probe = sorted_rows
    elif rows_order == "shuffled":
        probe, codes = sorted_rows.take(pa.array(rng.permutation(sorted_rows.num_rows))), None
    else:
        repeated = np.sort(np.concatenate([np.arange(sorted_rows.num_rows), rng.choice(sorted_rows.num_rows, 40)]))
        probe, codes = sorted_rows.take(pa.array(repeated)), None  # still in order, but keys repeat
    given = existing if existing_as == "table" else iter(existing.to_batches(max_chunksize=7))
    mask = existing_mask(probe, given, _contract(), codes if with_codes else None)
    expected = _reference_mask(probe, existing, ["device_id", "ts"])
    assert expected.sum() > 20 and (~expected).sum() > 20
    assert mask.tolist() == expected.tolist()


@pytest.mark.parametrize("main_order", ["sorted", "time_order", "shuffled"])
@pytest.mark.parametrize("series_as", ["dictionary", "text"])
def test_sort_codes_in_key_order_meet_mains_rows_as_a_set_reference_finds_them(main_order, series_as):
    """Keys given as sort codes in key order (a writer's sorted unit, a staged file in order; with repeats)
    meet main's rows in any order, a batch at a time: series main holds that the keys lack, a null series
    and times on no key match nothing; the compiled pass gives the same count it marks."""
    rng = np.random.default_rng(8)
    rows = make_readings("2026-01-01", days=0.5, devices=6, step_minutes=10)
    repeated = np.sort(np.concatenate([np.arange(rows.num_rows), rng.choice(rows.num_rows, 30)]))
    keys = rows.sort_by([("device_id", "ascending"), ("ts", "ascending")]).take(pa.array(repeated))
    codes = write.sort_key_codes(keys, _contract())
    main = pa.concat_tables([keys.take(pa.array(rng.choice(keys.num_rows, 60, replace=False))),
                             make_readings("2026-01-01", days=0.5, devices=9, step_minutes=7)]).select(["device_id", "ts"])
    main = pa.concat_tables([main, pa.table({"device_id": pa.array([None], pa.string()), "ts": main.column("ts").slice(0, 1)})])
    if main_order == "shuffled":
        main = main.take(pa.array(rng.permutation(main.num_rows)))
    elif main_order == "time_order":  # as live writers leave main: each series ascends, the keys do not
        main = main.sort_by([("ts", "ascending"), ("device_id", "ascending")])
    else:
        main = main.sort_by([("device_id", "ascending"), ("ts", "ascending")])
    if series_as == "dictionary":
        main = main.set_column(0, "device_id", pc.dictionary_encode(main.column("device_id")))
    assert meets(codes, "device_id")
    found = met(codes, "device_id", "ts", iter(main.to_batches(max_chunksize=23)))
    expected = _reference_mask(keys, main.cast(pa.schema([pa.field("device_id", pa.string()), main.schema.field("ts")])),
                               ["device_id", "ts"])
    assert found.tolist() == expected.tolist() and 60 <= expected.sum() < len(expected)
    batch = main.combine_chunks().to_batches()[0]
    theirs, lookup = write.series_codes_in(batch.column("device_id"), codes.distinct["device_id"])
    at = batch.column("ts").cast(pa.int64()).to_numpy()
    ranks, times = (np.ascontiguousarray(c) for c in codes.columns)
    once = np.zeros(len(times), dtype=bool)
    assert _keymatch.meet(ranks, times, len(codes.distinct["device_id"]), theirs, at, once, lookup) == expected.sum()
    assert once.tolist() == expected.tolist()


@pytest.mark.parametrize("series", [1, 3, 4, 5, 9, 13])
@pytest.mark.parametrize("shape", ["mixed", "more_keys"])
def test_compiled_meet_walks_series_four_at_a_time_as_a_set_lookup_finds(series, shape):
    """`_keymatch.meet` walks four series' keys beside their rows in turn: whatever the number of series
    (a last group of fewer than four), series with keys and no rows, rows and no keys, far more rows
    than keys or far fewer (the walk then skips over the rows), repeated keys and repeated rows, each key
    is marked as a set lookup marks it, and the count is of keys marked. ``more_keys``: every series has
    more keys than rows (a unit against main's rows of it), in walks of four that end apart."""
    rng = np.random.default_rng(series)
    if shape == "more_keys":
        sizes = [(int(rng.integers(300, 500)), int(rng.integers(10, 250))) for _ in range(series)]
    else:
        sizes = [(int(rng.integers(0, 400)), int(rng.integers(0, 400))) for _ in range(series)]
        sizes[0] = (30, 900)  # far more rows than keys
    if series > 1 and shape == "mixed":
        sizes[1] = (700, 2)  # far fewer
    if series > 2 and shape == "mixed":
        sizes[2] = (0, 50)  # rows of a series without keys; and one with keys but no rows
        sizes[-1] = (60, 0)
    ranks = np.concatenate([np.full(k, r, dtype=np.int32) for r, (k, _) in enumerate(sizes)])
    times = np.concatenate([np.sort(rng.integers(0, 500, k)) for k, _ in sizes]).astype(np.int64)  # repeats
    codes = np.concatenate([np.full(m, r, dtype=np.int64) for r, (_, m) in enumerate(sizes)])
    theirs = rng.integers(0, 500, len(codes), dtype=np.int64)
    shuffled = rng.permutation(len(codes))
    codes, theirs = codes[shuffled], theirs[shuffled]
    held = set(zip(codes.tolist(), theirs.tolist(), strict=True))
    expected = np.array([(r, t) in held for r, t in zip(ranks.tolist(), times.tolist(), strict=True)], dtype=bool)
    found = np.zeros(len(times), dtype=bool)
    assert _keymatch.meet(ranks, times, series, codes, theirs, found) == expected.sum()
    assert found.tolist() == expected.tolist()
    assert 0 < expected.sum() < len(expected)


def test_codes_that_do_not_meet_are_left_to_the_packer(walk):
    """`met` answers only for the usual key's codes with the compiled pass: a null series among the keys,
    no compiled module or codes of another shape go to the packer."""
    rows = make_readings("2026-01-01", days=0.1, devices=3, step_minutes=30)
    codes = write.sort_key_codes(rows.sort_by([("device_id", "ascending"), ("ts", "ascending")]), _contract())
    assert meets(codes, "device_id") == (walk == "compiled")
    with_null = write.sort_key_codes(pa.table({"device_id": pa.array(["a", None]), "ts": rows.column("ts").slice(0, 2)}),
                                     _contract())
    assert not meets(with_null, "device_id")
    assert not meets(write.KeyCodes(codes.columns[:1], codes.distinct), "device_id")


@pytest.mark.parametrize("chunk", [3, 1 << 20], ids=["small_chunks", "one_chunk"])
@pytest.mark.parametrize("ordered", [True, False], ids=["met", "packed"])
def test_merge_writer_packs_its_keys_over_the_sort_codes_and_drops_main_keys_in_place(monkeypatch, chunk, ordered, walk):
    """A writer in merge mode meets main's rows with its unit's sort codes (in key order: ``ordered``) or
    packs the keys over them, using them up either way (so a unit's keys are held once), then moves the kept rows to the front of its sorted order a chunk at a time. The kept
    order, the count and the sum dropped equal a reference, the rows themselves (whose times the codes
    view) are untouched, with source duplicates and chunk edges anywhere."""
    monkeypatch.setattr(write, "COMPACT_ROWS", chunk)
    monkeypatch.setattr(KeyPacker, "CHUNK", chunk)
    rng = np.random.default_rng(4)
    source = make_readings("2026-01-01", days=0.5, devices=6, step_minutes=10)
    corrections = source.take(pa.array(rng.choice(source.num_rows, 9, replace=False)))
    rows = pa.concat_tables([source.take(pa.array(rng.permutation(source.num_rows))), corrections]).combine_chunks()
    before = rows.column("ts").to_pylist()
    order, _, duplicates, codes = sorted_order(rows, _contract())
    assert duplicates == 9
    existing = pa.concat_tables([rows.take(pa.array(rng.choice(rows.num_rows, 50, replace=False))),
                                 make_readings("2026-01-01", days=0.5, devices=9, step_minutes=7)]).select(["device_id", "ts"])
    mask = existing_mask(rows, iter(existing.to_batches(max_chunksize=7)), _contract(), codes, consume=True, ordered=ordered)
    assert codes.columns == []
    expected = _reference_mask(rows.take(pa.array(order)), existing, ["device_id", "ts"])
    assert mask.tolist() == expected.tolist() and 0 < expected.sum() < len(order)
    values = rows.column("value").to_numpy()
    kept, dropped, dropped_sum = _drop_marked(rows, order.copy(), mask, _contract())
    assert kept.tolist() == order[~expected].tolist() and dropped == expected.sum()
    assert dropped_sum == pytest.approx(values[order[expected]].sum())
    assert rows.column("ts").to_pylist() == before

def test_files_carry_the_sort_order_id_and_nan_counts(sensor, readings):
    """Other engines trust both: the sort order id says the file is sorted as the table declares
    (merge joins, compaction skip a re-sort), NaN counts let them prune ``isnan`` / ``= 'NaN'``."""
    source = readings(recent(5), days=2, devices=2)
    values = source.column("value").to_pylist()
    for i in (3, 7, 30):  # two NaNs on the first day, one on the second (device d00, hourly)
        values[i] = math.nan
    source = source.set_column(2, "value", pa.array(values))
    sensor.backfill(source=source).wait()
    table = sensor.refresh().iceberg
    value_id = table.schema().find_field("value").field_id
    files = [t.file for t in table.scan().plan_files()]
    assert table.sort_order().order_id != 0 and {f.sort_order_id for f in files} == {table.sort_order().order_id}
    assert sorted(dict(f.nan_value_counts)[value_id] for f in files) == [1, 2]
    assert all(table.schema().find_field("ts").field_id not in dict(f.nan_value_counts) for f in files)


def test_nan_counts_are_of_the_rows_a_merge_keeps_and_leave_nulls_out(sensor, readings):
    """A merge drops the rows whose keys main holds: a NaN among them is not in the file, nor counted;
    a null value is no NaN."""
    source = readings(recent(5), days=1, devices=2)
    values = source.column("value").to_pylist()
    values[3], values[7], values[9] = math.nan, math.nan, None
    source = source.set_column(2, "value", pa.array(values))
    sensor.append(source.slice(3, 1).set_column(2, "value", pa.array([1.5])))  # main holds row 3's key: it wins
    sensor.backfill(source=source).wait()
    table = sensor.refresh().iceberg
    value_id = table.schema().find_field("value").field_id
    counts = {f.file_path: dict(f.nan_value_counts or {}).get(value_id) for f in (t.file for t in table.scan().plan_files())}
    written = [count for path, count in counts.items() if "/bf-" in path]
    assert written == [1] and len(counts) == 2  # the NaN of row 3 went with its row; the null is no NaN


def test_raw_measurements_are_written_plain_and_repeating_columns_keep_their_dictionary(sensor, readings):
    """A column whose values hardly repeat (raw readings) gains nothing from a Parquet dictionary but
    the writer's time building one; a day of such readings is written plain, a day of readings of fixed
    precision keeps its dictionary, as the series and the time grid do. Both read back as written."""
    source = readings(recent(4), days=2, devices=4, step_minutes=1)
    first_day = pc.less(source.column("ts"), source.column("ts")[0].as_py() + timedelta(days=1)).to_numpy(zero_copy_only=False)
    raw = np.random.default_rng(7).normal(20.0, 5.0, source.num_rows)
    values = np.where(first_day, raw, np.round(raw, 1))
    source = source.set_column(2, "value", pa.array(values))
    sensor.backfill(source=source).wait()
    table = sensor.refresh().iceberg
    files = sorted(t.file.file_path for t in table.scan().plan_files())
    assert len(files) == 2
    encodings = []
    for path in files:
        meta = pq.read_metadata(path.removeprefix("file://"))
        group = meta.row_group(0)
        encodings.append({group.column(i).path_in_schema: "RLE_DICTIONARY" in group.column(i).encodings for i in range(meta.num_columns)})
    assert encodings == [{"ts": True, "device_id": True, "value": False}, {"ts": True, "device_id": True, "value": True}]
    back = table.scan().to_arrow().sort_by([("device_id", "ascending"), ("ts", "ascending")])
    assert back.column("value").to_pylist() == source.sort_by([("device_id", "ascending"), ("ts", "ascending")]).column("value").to_pylist()


def test_series_statistics_cover_every_step_of_the_writer(sensor, readings):
    """The Parquet writer takes a file's rows a step (`write.WRITE_BATCH_ROWS`) at a time, and for the
    series, a dictionary column, updates its statistics from the dictionary values each step uses. Engines
    skip row groups and files by those bounds (``device_id = ...``): they must span the file's first and
    last series, which lie several steps apart."""
    source = readings(recent(4), days=1, devices=12, step_minutes=1)
    sensor.backfill(source=source).wait()
    table = sensor.refresh().iceberg
    [task] = list(table.scan().plan_files())
    series = sorted(set(source.column("device_id").to_pylist()))
    meta = pq.read_metadata(task.file.file_path.removeprefix("file://"))
    assert meta.num_rows > 2 * write.WRITE_BATCH_ROWS
    column = [meta.row_group(0).column(i) for i in range(meta.num_columns) if meta.row_group(0).column(i).path_in_schema == "device_id"][0]
    assert "RLE_DICTIONARY" in column.encodings
    assert (column.statistics.min, column.statistics.max, column.statistics.null_count) == (series[0], series[-1], 0)
    field_id = table.schema().find_field("device_id").field_id
    assert (task.file.lower_bounds[field_id], task.file.upper_bounds[field_id]) == (series[0].encode(), series[-1].encode())


@pytest.mark.parametrize("mine_order", ["ascending", "repeats", "shuffled"])
@pytest.mark.parametrize("hits", [0, 3, 400])
@pytest.mark.parametrize("span", [1 << 22, 5], ids=["merged", "searched"])
def test_rare_marking_equals_the_search_and_a_set_reference(monkeypatch, mine_order, hits, span, walk):
    """The audit's marking (``rare``: a merge of each batch with the keys it spans before any search) marks
    exactly what the search alone marks: keys repeated on either side, keys of main the file lacks, and
    spans too long to merge (then searched as before)."""
    monkeypatch.setattr(write, "MERGE_SPAN", span)
    rng = np.random.default_rng(hits)
    universe = np.sort(rng.choice(1 << 40, 3_000, replace=False)).astype(np.int64)
    mine = universe[:2_000].copy()
    if mine_order == "repeats":
        mine = np.sort(np.concatenate([mine, rng.choice(mine, 50)]))
    elif mine_order == "shuffled":
        mine = rng.permutation(mine)
    theirs = np.concatenate([rng.choice(universe[:2_000], hits, replace=False), universe[2_000:],
                             universe[2_000:2_030], rng.choice(universe[:2_000], min(hits, 5))])  # repeats in main
    packer = KeyPacker("device_id", "ts", pa.array(["d"]), 0, 41)
    batches = [pa.record_batch({"device_id": pa.array(["d"] * len(part)), "ts": pa.array(part, pa.int64())})
               for part in np.array_split(rng.permutation(theirs), 3)]
    rare = packer.mark(mine, iter(batches), rare=True)
    assert rare.tolist() == packer.mark(mine, iter(batches)).tolist() == np.isin(mine, theirs).tolist()
    assert rare.sum() >= hits


@pytest.mark.parametrize("sizes", [(0, 5), (5, 0), (1, 1), (2_000, 600), (30, 5_000), (4_000, 7), (7, 4_000)], ids=str)
def test_compiled_walk_marks_what_a_set_lookup_marks_with_repeats_on_both_sides(sizes):
    """The walk over two sorted arrays marks every key of the first that the second holds, each repeat of
    it too; a key repeated in the second marks nothing more; earlier marks stay (one call per batch of
    main); it returns how many keys of the first this call found. Either side may be empty or the
    longer, by a little or by far (the longer side is skipped over eight keys at a time), and keys span
    the whole int64 range (a packed key is never negative, but the walk does not rely on it)."""
    rng = np.random.default_rng(sum(sizes))
    pool = rng.integers(-(1 << 62), 1 << 62, 3_000, dtype=np.int64)
    mine = np.sort(rng.choice(pool, sizes[0]))  # with replacement: repeats
    theirs = np.sort(rng.choice(pool, sizes[1]))
    mask = np.zeros(len(mine), dtype=bool)
    if len(mine):
        mask[0] = True  # marked by an earlier batch
    found = _keymatch.mark(mine, theirs, mask)
    expected = np.isin(mine, theirs)
    assert found == expected.sum()
    if len(mine):
        expected[0] = True
    assert mask.tolist() == expected.tolist()
    if sizes == (2_000, 600):
        assert 0 < found < len(mine) and len(np.unique(mine)) < len(mine) and len(np.unique(theirs)) < len(theirs)


@pytest.mark.parametrize("series", [1, 7, 300])
def test_compiled_series_order_sorts_keys_whose_series_each_ascend_and_declines_the_rest(series):
    """Keys in time order (each series ascending, the series interleaved) come out sorted and the call says
    so; shuffled keys come back declined (the caller sorts them), as do a negative key and more series than
    keys, which counting cannot place or would place slowly."""
    rng = np.random.default_rng(series)
    bits = 20
    times = np.sort(rng.integers(0, 1 << bits, 2_000))
    keys = (rng.integers(0, series, len(times)) << bits) | times  # time order: every series ascends
    out = np.empty_like(keys)
    assert _keymatch.by_series(keys, bits, out)
    assert out.tolist() == np.sort(keys).tolist()
    shuffled = rng.permutation(keys)
    assert not _keymatch.by_series(shuffled, bits, out)
    assert not _keymatch.by_series(np.array([5, -1], dtype=np.int64), bits, np.empty(2, dtype=np.int64))
    assert not _keymatch.by_series(np.array([9 << bits, 1], dtype=np.int64), bits, np.empty(2, dtype=np.int64))
    with pytest.raises(ValueError, match="out must hold 2000 keys"):
        _keymatch.by_series(keys, bits, np.empty(5, dtype=np.int64))


def test_compiled_walk_refuses_arrays_it_cannot_read_as_they_are():
    """Keys of another width, a mask of the wrong length or one it may not write are refused with the
    argument named, not read as something else."""
    keys = np.arange(10, dtype=np.int64)
    with pytest.raises(TypeError, match="mine must be a contiguous int64 array"):
        _keymatch.mark(keys.astype(np.int32), keys, np.zeros(10, dtype=bool))
    with pytest.raises(TypeError, match="theirs must be a contiguous int64 array"):
        _keymatch.mark(keys, keys.astype(np.float64), np.zeros(10, dtype=bool))
    with pytest.raises((TypeError, ValueError), match="contiguous"):
        _keymatch.mark(keys[::2], keys, np.zeros(5, dtype=bool))
    with pytest.raises(ValueError, match="mask must be 10 bytes"):
        _keymatch.mark(keys, keys, np.zeros(9, dtype=bool))
    frozen = np.zeros(10, dtype=bool)
    frozen.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        _keymatch.mark(keys, keys, frozen)


@pytest.mark.parametrize("index_type", [pa.int8(), pa.int32()], ids=["int8_indices", "int32_indices"])
@pytest.mark.parametrize("as_dictionary", [True, False], ids=["dictionary", "text"])
def test_packing_equals_a_reference_with_unknown_series_nulls_and_times_outside(index_type, as_dictionary, walk):
    """A key packs as its series' rank over its time's offset; a row whose series the packer does not know
    (or a null) or whose time falls outside the packer's range cannot match and is left out, with the
    rows that can named. Packed into the times' own array or a new one, compiled or not, from a
    dictionary column of any index width or from plain text."""
    distinct = pa.array(["a", "b", "c"])
    packer = KeyPacker("device_id", "ts", distinct, 1_000, 10)
    rng = np.random.default_rng(11)
    n = 500
    values = rng.choice(["a", "b", "c", "x", None], n, p=[0.3, 0.3, 0.3, 0.05, 0.05]).tolist()
    times = rng.integers(900, 2_100, n).astype(np.int64)  # [1000, 2024) fits 10 bits
    series = pa.array(values).dictionary_encode()
    series = pa.DictionaryArray.from_arrays(series.indices.cast(index_type), series.dictionary) if as_dictionary else pa.array(values)
    rank = {"a": 0, "b": 1, "c": 2}
    can = [(i, rank[v] << 10 | (t - 1_000)) for i, (v, t) in enumerate(zip(values, times.tolist(), strict=True))
           if v in rank and 1_000 <= t < 2_024]
    assert 0 < len(can) < n
    for out in (None, times.copy()):
        packed, at = packer.pack_keys(series, times.copy() if out is None else out, out=out)
        assert at is not None and at.tolist() == [i for i, _ in can] and packed.tolist() == [k for _, k in can]
    inside = np.array([i for i, _ in can])
    packed, at = packer.pack_keys(series.take(pa.array(inside)), times[inside])
    assert at is None and packed.tolist() == [k for _, k in can]
    ranks = np.array([rank[values[i]] for i in inside], dtype=np.int32)
    assert packer.pack(ranks, times[inside]).tolist() == [k for _, k in can]


def test_compiled_packing_refuses_what_it_cannot_pack():
    """Codes of another width, arrays of different lengths and a time width past 62 bits are refused with
    what is wrong named."""
    codes, times = np.zeros(4, dtype=np.int32), np.arange(4, dtype=np.int64)
    with pytest.raises(TypeError, match="codes must be a contiguous int32 or int64 array"):
        _keymatch.pack(codes.astype(np.int16), times, 0, 8, np.empty(4, dtype=np.int64))
    with pytest.raises(TypeError, match="out must be a contiguous int64 array"):
        _keymatch.pack(codes, times, 0, 8, np.empty(4, dtype=np.int32))
    with pytest.raises(TypeError, match="lookup must be a contiguous int64 array"):
        _keymatch.pack(codes, times, 0, 8, np.empty(4, dtype=np.int64), np.zeros(2, dtype=np.int32))
    with pytest.raises(ValueError, match="one value a row: 3, 4 and 4"):
        _keymatch.pack(codes[:3], times, 0, 8, np.empty(4, dtype=np.int64))
    with pytest.raises(ValueError, match="time_bits must be 1 to 62, not 63"):
        _keymatch.pack(codes, times, 0, 63, np.empty(4, dtype=np.int64))
    out = np.empty(4, dtype=np.int64)
    assert _keymatch.pack(np.array([0, 1, 5, -2], dtype=np.int64), times, 1, 8, out, np.array([3, 4], dtype=np.int64)) == 3
    assert out.tolist() == [-1, 4 << 8 | 0, -1, -1]  # time 0 is before base 1; code 5 is past the lookup


@pytest.mark.parametrize("values", ["float64", "int64", None])
def test_compiled_drop_moves_the_kept_rows_forward_and_sums_the_dropped_ones(values):
    """The kept entries of the order move to its front in order; the dropped rows' values are summed (as
    float64, ints too) and the kept rows' never touch the sum, not even a NaN or an infinity; nothing is
    summed without a column; an entry naming a row past the end, a mask of the wrong length and values of
    another type are refused."""
    rng = np.random.default_rng(5)
    order = rng.permutation(1_000).astype(np.int64)
    mask = rng.random(1_000) < 0.3
    column = rng.normal(size=1_000) if values == "float64" else rng.integers(-50, 50, 1_000) if values else None
    if column is not None and values == "float64":
        column[order[~mask][:3]] = [np.nan, np.inf, -np.inf]  # in kept rows: not in the sum
    expected_kept = order[~mask].tolist()
    expected_sum = float(column[order[mask]].sum()) if column is not None else 0.0
    kept, dropped_sum = _keymatch.drop(order, mask, column, 1_000)
    assert kept == len(expected_kept) and order[:kept].tolist() == expected_kept
    assert dropped_sum == pytest.approx(expected_sum)
    with pytest.raises(ValueError, match=r"order\[\d+\] names row 1000 of 1000"):
        _keymatch.drop(np.array([1_000], dtype=np.int64), np.ones(1, dtype=bool), np.zeros(1_000), 1_000)
    with pytest.raises(ValueError, match="mask must be 3 bytes"):
        _keymatch.drop(np.arange(3, dtype=np.int64), np.ones(2, dtype=bool), None, 3)
    with pytest.raises(TypeError, match="values must be a contiguous float64 or int64 array"):
        _keymatch.drop(np.arange(3, dtype=np.int64), np.ones(3, dtype=bool), np.zeros(3, dtype=np.float32), 3)
    with pytest.raises(ValueError, match="values must hold one value a row: 4, not 3"):
        _keymatch.drop(np.arange(3, dtype=np.int64), np.ones(3, dtype=bool), np.zeros(3), 4)
