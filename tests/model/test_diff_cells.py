"""A diff's cells are one per (day, series) whichever way they were counted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from timelake.model.diff import combine, count_cells, kept_runs


def _cells(days: list[int], codes: list[int], labels: list[str], values: list[float]) -> pa.Table:
    return count_cells(["value"], np.array(days, dtype=np.int64), np.array(codes, dtype=np.int64), pa.array(labels, pa.string()),
                       {"rows_before": None, "value.count_before": None, "value.sum_before": np.array(values)})


@pytest.mark.parametrize("days", [[20_000] * 5, [20_000, 20_001, 20_000, 20_001, 20_000]])
def test_counted_cells_sum_rows_and_values_per_day_and_series(days):
    cells = combine([_cells(days, [1, 0, 1, 1, 0], ["a", "b"], [1.0, 2.0, 3.0, 4.0, 5.0])], ["value"])
    got = {(r["day"], r["series"]): (r["rows_before"], r["value.count_before"], r["value.sum_before"]) for r in cells.to_pylist()}
    expected: dict[tuple[int, str], list[float]] = {}
    for day, code, value in zip(days, [1, 0, 1, 1, 0], [1.0, 2.0, 3.0, 4.0, 5.0], strict=True):
        cell = expected.setdefault((day, ["a", "b"][code]), [0, 0, 0.0])
        cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + 1, cell[2] + value
    assert got == {k: tuple(v) for k, v in expected.items()}
    assert cells.column("day").to_pylist() == sorted(cells.column("day").to_pylist())


def test_one_counting_whose_series_share_a_label_is_still_one_cell_per_label():
    """A null series and an empty one are both labelled "": their rows land in one cell."""
    cells = combine([_cells([20_000] * 3, [0, 1, 1], ["", ""], [1.0, 2.0, 4.0])], ["value"])
    [cell] = cells.to_pylist()
    assert (cell["series"], cell["rows_before"], cell["value.count_before"], cell["value.sum_before"]) == ("", 3, 3, 7.0)


def test_cells_of_several_countings_are_added_up():
    first = _cells([20_000, 20_000], [0, 1], ["a", "b"], [1.0, 2.0])
    second = _cells([20_000], [0], ["b"], [5.0])
    cells = combine([first, second], ["value"])
    assert [(r["series"], r["rows_before"], r["value.sum_before"]) for r in cells.to_pylist()] == [("a", 1, 1.0), ("b", 2, 7.0)]


def test_facts_round_trip_and_a_job_begun_before_ipc_facts_reads_its_parquet_ones(tmp_path):
    """Facts are written as Arrow IPC and read back whole, samples included. A job begun by an engine that
    wrote them as Parquet and resumed after an upgrade finds those, beside the new name; a unit that wrote
    none has none."""
    import json

    import pyarrow.parquet as pq

    from timelake.adapters.objects import ArrowObjects
    from timelake.model.diff import SAMPLES_KEY, read_facts, write_facts

    objects = ArrowObjects()
    cells = _cells([20_000, 20_001], [0, 1], ["a", "b"], [1.5, 2.5])
    samples = {"only_before": [{"key": {"device_id": "a"}, "before": {"value": 1.5}}]}
    write_facts(f"{tmp_path}/units/u1.facts.arrow", cells, samples, objects=objects)
    assert (tmp_path / "units" / "u1.facts.arrow").read_bytes()[:6] == b"ARROW1"
    back = read_facts(f"{tmp_path}/units/u1.facts.arrow", objects=objects)
    assert back is not None and back[0].equals(cells) and back[1] == samples
    pq.write_table(cells.replace_schema_metadata({SAMPLES_KEY: json.dumps(samples).encode()}), tmp_path / "units" / "u2.parquet")
    older = read_facts(f"{tmp_path}/units/u2.facts.arrow", objects=objects)
    assert older is not None and older[0].equals(cells) and older[1] == samples
    assert read_facts(f"{tmp_path}/units/u3.facts.arrow", objects=objects) is None


def test_a_merge_units_count_of_main_rides_in_its_facts_and_is_left_out_when_asked(tmp_path):
    """A merge unit keeps main's rows it counted after its own cells, in one file: read whole where the cut
    took that count, without them where it did not; a file with no count (main's rows counted apart, as
    earlier engines did, or by main tasks) says so, and one of main's rows none there does not."""
    from timelake.adapters.objects import ArrowObjects
    from timelake.model.diff import read_facts, write_facts

    objects = ArrowObjects()
    mine = _cells([20_000, 20_000], [0, 1], ["a", "b"], [1.5, 2.5])
    main = _cells([20_000], [0], ["a"], [7.0])
    write_facts(f"{tmp_path}/u1.facts.arrow", mine, {}, objects=objects, before=main)
    whole = read_facts(f"{tmp_path}/u1.facts.arrow", objects=objects)
    assert whole is not None and whole[0].equals(pa.concat_tables([mine, main])) and whole[2]
    alone = read_facts(f"{tmp_path}/u1.facts.arrow", objects=objects, before=False)
    assert alone is not None and alone[0].equals(mine) and alone[2]
    write_facts(f"{tmp_path}/u2.facts.arrow", mine, {}, objects=objects, before=main.slice(0, 0))
    empty = read_facts(f"{tmp_path}/u2.facts.arrow", objects=objects, before=False)
    assert empty is not None and empty[0].equals(mine) and empty[2]  # main held no row there: counted all the same
    write_facts(f"{tmp_path}/u3.facts.arrow", mine, {}, objects=objects)
    none = read_facts(f"{tmp_path}/u3.facts.arrow", objects=objects, before=False)
    assert none is not None and none[0].equals(mine) and not none[2]


def test_rows_of_one_day_given_as_that_day_count_as_their_day_numbers_do():
    """A day's unit counts main as one day (no day number a row): the same cells and samples."""
    from timelake.model.contract import Contract
    from timelake.model.diff import Before

    contract = Contract(time_column="ts", series_key=("device_id",), dedup_key=("device_id", "ts"), retention=None, tiers=(),
                        target_file_size=1 << 27, check_column=None)
    base = 20_000 * 86_400 * 10**6
    rows = pa.table({"ts": pa.array([base + 5, base + 1, base + 9, base + 3], pa.timestamp("us", tz="UTC")),
                     "device_id": pa.array(["b", "a", "b", "a"]).dictionary_encode(), "value": [1.0, 2.0, None, 4.0]})
    counted: dict[str, tuple[list[dict[str, object]], list[dict[str, object]]]] = {}
    for name, days in (("array", np.full(rows.num_rows, 20_000, dtype=np.int64)), ("int", 20_000)):
        before = Before(["value"], contract)
        before.add(rows, days)
        counted[name] = (combine(before._cells, ["value"]).to_pylist(), before._samples)
    assert counted["int"] == counted["array"]
    cells = {r["series"]: (r["day"], r["rows_before"], r["value.count_before"], r["value.sum_before"]) for r in counted["int"][0]}
    assert cells == {"a": (20_000, 2, 2, 6.0), "b": (20_000, 2, 1, 1.0)}
    assert len(counted["int"][1]) == 4


@pytest.mark.parametrize("share", [0.0, 0.3, 0.9, 1.0])
def test_kept_runs_are_where_each_runs_rows_begin_once_the_dropped_rows_are_gone(share):
    """Merge mode drops the rows whose key main holds: each run's start moves back by the rows dropped
    before it, and a run that lost every row is gone; the starts equal those found by walking the kept
    rows' run labels."""
    rng = np.random.default_rng(int(share * 10))
    sizes = rng.integers(1, 40, 60)
    sizes[:3] = 1  # one-row runs, which are gone whenever their row is
    label = np.repeat(np.arange(len(sizes)), sizes)
    dropped = rng.random(len(label)) < share
    dropped[:sizes[0] + sizes[1]] = True  # a run at the start gone whole
    starts = np.append(0, np.cumsum(sizes)[:-1]).astype(np.int64)
    kept = label[~dropped]
    expected = np.flatnonzero(np.append(True, kept[1:] != kept[:-1])) if len(kept) else np.zeros(0, dtype=np.int64)
    assert kept_runs(starts, dropped).tolist() == expected.tolist()
    assert kept_runs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)).tolist() == []
