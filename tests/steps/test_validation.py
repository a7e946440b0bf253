"""The checks catch staged data that does not match what the units wrote (steps driven one by one)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import SCHEMA, recent, stage_job
import timelake.steps.validate as validate_module
from timelake.errors import ValidationFailed
from timelake.steps import write as write_module
from timelake.steps.validate import validate
from timelake.steps.write import KeyPacker


def _staged_job(lake, source) -> tuple[str, str]:
    job_id = stage_job(lake, source)
    return job_id, lake.runtime.store.units(job_id)[0].result["path"].removeprefix("file://")


def test_clean_staging_passes_every_check(lake, sensor, readings):
    job_id, _ = _staged_job(lake, readings(recent(4), days=1, devices=3))
    assert validate(lake.runtime, job_id)["passed"]
    checks = {c["name"]: c["passed"] for c in lake.runtime.store.get_job(job_id).state["checks"]}
    assert checks == {"row_count_balance": True, "staged_files_match_units": True, "time_bounds": True,
                      "required_not_null": True, "files_sorted": True, "unique_keys_in_staged": True,
                      "no_overlap_with_main": True, "aggregate_matches_source": True, "reject_budget": True}


def test_tampered_file_fails_sorting_uniqueness_and_aggregate(lake, sensor, readings):
    job_id, path = _staged_job(lake, readings(recent(4), days=1, devices=3))
    rows = pq.read_table(path)
    ts = rows.column("ts").to_pylist()
    ts[1] = ts[0]  # a duplicate key, same row count
    values = pc.add(rows.column("value"), 1.0)
    tampered = pa.table({"ts": pa.array(ts, rows.schema.field("ts").type), "device_id": rows.column("device_id"),
                         "value": values}, schema=rows.schema)
    pq.write_table(tampered.take(pa.array(range(tampered.num_rows - 1, -1, -1))), path)  # and out of order
    with pytest.raises(ValidationFailed, match="files_sorted, unique_keys_in_staged, aggregate_matches_source"):
        validate(lake.runtime, job_id)
    job = lake.runtime.store.get_job(job_id)
    failed = {c["name"]: c for c in job.state["checks"] if not c["passed"]}
    assert set(failed) == {"files_sorted", "unique_keys_in_staged", "aggregate_matches_source"}
    assert failed["unique_keys_in_staged"]["samples"][0]["device_id"] == "d00"
    assert job.phase == "failed_validation" and sensor.to_arrow().num_rows == 0
    assert f"backfill/{job_id}" in sensor.refresh().iceberg.metadata.refs


@pytest.mark.parametrize("partition_by", ["day", "year"])
@pytest.mark.parametrize("one_batch", ["met", "packed"])
def test_a_staged_key_already_on_main_at_the_plan_fails_merge_validation(lake, readings, partition_by, one_batch, monkeypatch):
    """Main's rows are read per staged file (the file's partition only); a key of main smuggled into a
    staged file in place of one of its own rows is caught, in that file, with the key as the sample. By
    day the file, one batch in order, meets main's rows with its sort codes (or, without the compiled
    pass, has its keys packed from them); a year file of more rows than fit beside a year's times (2^17)
    has its series read first, then packed."""
    met = []
    if one_batch == "packed":
        monkeypatch.setattr(validate_module, "meets", lambda codes, series: False)
    else:
        monkeypatch.setattr(validate_module, "met", lambda *a: met.append(a) or write_module.met(*a))
    devices, step = (3, 60) if partition_by == "day" else (100, 1)  # 144,000 rows in the year file
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by=partition_by, retention="P3Y", target_file_size="64MB")
    existing = readings(recent(3), days=1, devices=1, step_minutes=180, seed=1)  # d00 every 3 h, day one
    table.append(existing)
    job_id = stage_job(lake, readings(recent(3), days=2 if partition_by == "day" else 1, devices=devices,
                                      step_minutes=step, seed=2))  # the unit drops those 8 keys
    first_day = min(lake.runtime.store.units(job_id), key=lambda u: u.info["start"])
    assert first_day.result["rows_conflicting_existing"] == existing.num_rows
    path = first_day.result["path"].removeprefix("file://")
    rows = pq.read_table(path)
    span_us = 86_400_000_000 * (1 if partition_by == "day" else 366)  # the file's partition, as validation packs it
    assert KeyPacker.room(0, span_us - 1, rows.num_rows) == (partition_by == "day")  # which of the two ways runs
    key = existing.column("ts")[1]  # d00 at 03:00, which the unit dropped
    assert rows.column("device_id")[0].as_py() == "d00" and rows.column("ts")[0].as_py() < key.as_py()
    stolen = rows.slice(0, 1).set_column(0, rows.schema.field("ts"), pa.array([key.as_py()], rows.schema.field("ts").type))
    tampered = pa.concat_tables([stolen.cast(rows.schema), rows.slice(1)]).sort_by([("device_id", "ascending"), ("ts", "ascending")])
    pq.write_table(tampered, path)
    with pytest.raises(ValidationFailed, match="no_overlap_with_main"):
        validate(lake.runtime, job_id)
    failed = {c["name"]: c for c in lake.runtime.store.get_job(job_id).state["checks"] if not c["passed"]}
    assert set(failed) == {"no_overlap_with_main"}
    assert "1 staged key(s) already exist on main" in failed["no_overlap_with_main"]["detail"]
    assert failed["no_overlap_with_main"]["samples"] == [{"device_id": "d00", "ts": key.as_py().isoformat()}]
    assert bool(met) == (partition_by == "day" and one_batch == "met")


@pytest.mark.parametrize("seam", ["duplicate", "unsorted", "main"])
def test_a_fault_at_the_seam_of_two_batches_is_caught(lake, sensor, readings, monkeypatch, seam):
    """A check holds one batch of a file at a time: a duplicate key, a row out of order or a key of main
    that sits exactly where one batch ends and the next begins is caught like any other."""
    monkeypatch.setattr(validate_module, "BATCH_ROWS", 10)
    if seam == "main":
        sensor.append(readings(recent(4), days=1, devices=1, step_minutes=60, seed=3).slice(10, 1))
    job_id, path = _staged_job(lake, readings(recent(4), days=1, devices=3))
    rows = pq.read_table(path)
    ts = rows.column("ts").to_pylist()
    if seam == "duplicate":
        ts[10] = ts[9]
    elif seam == "unsorted":
        ts[9], ts[10] = ts[10], ts[9]
    else:  # main's key (d00 at 10:00, which the unit dropped) in place of d00 at 11:00: still in order
        ts[10] = sensor.to_arrow().column("ts")[0].as_py()
        assert ts[9] < ts[10] < ts[11]
    pq.write_table(rows.set_column(0, rows.schema.field("ts"), pa.array(ts, rows.schema.field("ts").type)), path)
    expected = {"duplicate": "unique_keys_in_staged", "unsorted": "files_sorted", "main": "no_overlap_with_main"}[seam]
    with pytest.raises(ValidationFailed, match=expected):
        validate(lake.runtime, job_id)
    failed = {c["name"]: c for c in lake.runtime.store.get_job(job_id).state["checks"] if not c["passed"]}
    assert set(failed) == {expected}
    if seam == "unsorted":
        assert failed["files_sorted"]["samples"][0]["row"] == 10


def test_checks_fanned_out_per_file_equal_the_checks_of_one_pass(lake, sensor, readings):
    """Validation fans out one work item per staged file (`check_file`, each holding one file's columns)
    and `validate` combines their stored facts: the same checks, passed or failed, as one pass over all."""
    from timelake.steps.validate import check_file, check_items, plan_checks, run_checks

    rt = lake.runtime
    job_id = stage_job(lake, readings(recent(6), days=4, devices=3))
    path = rt.store.units(job_id)[1].result["path"].removeprefix("file://")
    rows = pq.read_table(path)
    ts = rows.column("ts").to_pylist()
    ts[3] = ts[2]
    pq.write_table(rows.set_column(0, rows.schema.field("ts"), pa.array(ts, rows.schema.field("ts").type)), path)
    job = rt.store.get_job(job_id)
    one_pass = run_checks(rt, job.spec, rt.store.units(job_id), job.state)
    assert plan_checks(rt, job_id)["files"] == 4
    results = [check_file(rt, job_id, item["file"], item["spec_id"], item["partition"]) for item in check_items(rt, job_id)]
    assert sorted(r["passed"] for r in results) == [False, True, True, True]
    Path(rt.store.units(job_id)[0].result["path"].removeprefix("file://")).unlink()  # validate reads no data file now
    with pytest.raises(ValidationFailed, match="unique_keys_in_staged"):
        validate(rt, job_id)
    assert [(c["name"], c["passed"], c["detail"]) for c in rt.store.get_job(job_id).state["checks"]] == \
        [(c.name, c.passed, c.detail) for c in one_pass]
    stored = list(Path(rt.staging_path(job_id, "validate").removeprefix("file://")).glob("*.json"))
    assert len(stored) == 4 + 1  # one facts file per staged file, and the list of work items


def test_checks_sharing_a_context_plan_main_once_and_find_what_a_check_alone_finds(lake, sensor, readings, monkeypatch):
    """Checks on threads of one process share main's plan (one per snapshot, over the job's range); a
    check on its own (a Lambda) plans its file's partition. Planning is pyiceberg reading manifests:
    per file, it was most of a merge job's validation. Either way a key of main put into a staged file
    in place of one of its rows is found, in that file only."""
    from timelake.model.layout import SnapshotRange
    from timelake.steps.validate import CheckContext, check_file, check_items, plan_checks

    rt = lake.runtime
    existing = readings(recent(4), days=3, devices=1, step_minutes=180, seed=1)  # d00 every 3 h, three days
    sensor.append(existing)
    job_id = stage_job(lake, readings(recent(4), days=3, devices=3, seed=2))  # the units drop those keys
    last = max(rt.store.units(job_id), key=lambda u: u.info["start"])
    path = last.result["path"].removeprefix("file://")
    rows = pq.read_table(path)
    ts = existing.column("ts")
    key = ts.filter(pc.greater_equal(ts, pa.scalar(rows.column("ts")[0].as_py(), ts.type)))[1]
    stolen = rows.slice(0, 1).set_column(0, rows.schema.field("ts"), pa.array([key.as_py()], rows.schema.field("ts").type))
    pq.write_table(pa.concat_tables([stolen.cast(rows.schema), rows.slice(1)]).sort_by(
        [("device_id", "ascending"), ("ts", "ascending")]), path)
    plan_checks(rt, job_id)
    items = check_items(rt, job_id)
    plans: list[tuple[int, int]] = []
    planned = SnapshotRange.__init__

    def counted(self, table, column, start_us, end_us, *args, **kwargs):
        plans.append((start_us, end_us))
        planned(self, table, column, start_us, end_us, *args, **kwargs)

    monkeypatch.setattr(SnapshotRange, "__init__", counted)
    alone = [check_file(rt, job_id, i["file"], i["spec_id"], i["partition"]) for i in items]
    assert len(plans) == len(items) == 3
    plans.clear()
    context = CheckContext.of(rt, job_id, shared=True)
    shared = [check_file(rt, job_id, i["file"], i["spec_id"], i["partition"], context) for i in items]
    state = rt.store.get_job(job_id).state
    assert plans == [(state["range_start"], state["range_end"])]
    assert shared == alone and [r["file"] for r in shared if not r["passed"]] == [last.result["path"]]


@pytest.mark.parametrize("fault", [None, "time_outside", "null_series", "repeated_value", "text_column"])
def test_a_file_read_in_one_batch_packs_its_keys_from_its_sort_codes_as_the_general_pass_would(fault):
    """A day's file is one batch: its keys are packed from the sort codes its order check took. They
    equal the general pass's; a null series, a dictionary value that repeats or a time outside the
    partition leaves the file to the general pass. A plain text series column packs the same way."""
    import numpy as np

    from timelake.model.contract import Contract
    from timelake.steps.validate import _packed_codes
    from timelake.steps.write import sort_key_codes

    contract = Contract(time_column="ts", series_key=("device_id",), dedup_key=("device_id", "ts"), retention=None, tiers=(),
                        target_file_size=1 << 27, check_column=None)
    lo = 20_000 * 86_400_000_000
    hi = lo + 86_400_000_000
    dictionary = ["c", "a", "b", "a"] if fault == "repeated_value" else ["c", "a", "b"]
    indices = [1, 1, 2, 0, 0] if fault != "repeated_value" else [1, 3, 2, 0, 0]
    times = [lo, lo + 7, lo + 3, lo + 5, hi - 1]
    if fault == "time_outside":
        times[-1] = hi
    series = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32(), mask=np.array([False] * 4 + [fault == "null_series"])),
                                            pa.array(dictionary))
    rows = pa.table({"device_id": series.cast(pa.string()) if fault == "text_column" else series,
                     "ts": pa.array(times, pa.timestamp("us", tz="UTC"))})
    packed = np.full(rows.num_rows, -7, dtype=np.int64)
    packer = _packed_codes(sort_key_codes(rows, contract), "device_id", "ts", lo, hi, packed)
    if fault in ("time_outside", "null_series", "repeated_value"):
        assert packer is None and (packed == -7).all()
        return
    assert packer is not None and packer.distinct.to_pylist() == ["a", "b", "c"]
    general, at = packer.pack_keys(rows.column("device_id"), np.array(times, dtype=np.int64))
    assert at is None and packed.tolist() == general.tolist()
    values, found = packer.unpack(packed)
    assert values.to_pylist() == ["a", "a", "b", "c", "c"] and found.tolist() == times


@pytest.mark.parametrize("shape", ["dictionary", "unused_values", "text_column", "repeated_value", "out_of_order", "null_series"])
def test_a_batch_in_key_order_names_its_series_from_the_runs_of_its_sort_codes(shape, monkeypatch):
    """The audit's distinct series of a batch in key order are the values at the starts of its runs of one
    series rank, not every row's code hashed; they equal what hashing finds. A batch out of order or with a
    null series is hashed; a dictionary that holds a value twice gives it twice, once a run, and the file's
    values come out once each all the same."""
    import numpy as np

    from timelake.model.contract import Contract
    from timelake.steps.validate import _present, _sorted_distinct, _unique
    from timelake.steps.write import in_order, sort_key_codes

    contract = Contract(time_column="ts", series_key=("device_id",), dedup_key=("device_id", "ts"), retention=None, tiers=(),
                        target_file_size=1 << 27, check_column=None)
    dictionary = {"unused_values": ["z", "c", "a", "y", "b"], "repeated_value": ["c", "a", "b", "a"]}.get(shape, ["c", "a", "b"])
    a, b, c = dictionary.index("a"), dictionary.index("b"), dictionary.index("c")
    indices = [a, a, b, c, c] if shape != "repeated_value" else [1, 1, 2, 2, 0]
    times = [1, 2, 1, 1, 2] if shape != "out_of_order" else [2, 1, 1, 1, 2]
    series = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32(), mask=np.array([False] * 4 + [shape == "null_series"])),
                                            pa.array(dictionary))
    rows = pa.table({"device_id": series.cast(pa.string()) if shape == "text_column" else series,
                     "ts": pa.array(times, pa.timestamp("us", tz="UTC"))})
    codes = sort_key_codes(rows, contract)
    unsorted_at, _ = in_order(codes.columns)
    hashed = _unique(rows.column("device_id"))
    if shape in ("out_of_order", "null_series"):
        assert unsorted_at is not None or shape == "null_series"
    else:
        assert unsorted_at is None
        monkeypatch.setattr(validate_module, "_unique", lambda column: pytest.fail("a batch in order was hashed"))
    found = _present(rows.column("device_id"), codes, "device_id", unsorted_at is None)
    kind = rows.schema.field("device_id").type
    expected = ["a", "b", "c"] + ([None] if shape == "null_series" else [])
    assert sorted(_sorted_distinct([found], kind).to_pylist(), key=str) == sorted(_sorted_distinct([hashed], kind).to_pylist(), key=str)
    assert sorted(set(_sorted_distinct([found], kind).to_pylist()), key=str) == sorted(expected, key=str)


def test_facts_cut_short_are_taken_again_not_trusted(lake, sensor, readings):
    """A file's facts written only in part (the process killed, the disk full while it wrote them) count as
    none: the fan-out checks that file again and validation passes as it would have."""
    from timelake.steps.validate import check_file, check_items, plan_checks, unchecked

    rt = lake.runtime
    job_id = stage_job(lake, readings(recent(6), days=4, devices=3))
    plan_checks(rt, job_id)
    items = check_items(rt, job_id)
    for item in items:
        check_file(rt, job_id, item["file"], item["spec_id"], item["partition"])
    assert unchecked(rt, job_id, items) == []
    stored = sorted(Path(rt.staging_path(job_id, "validate").removeprefix("file://")).glob("*.json"))
    facts = [p for p in stored if p.read_text().startswith("{")]
    facts[0].write_text(facts[0].read_text()[:40])
    (again,) = unchecked(rt, job_id, items)
    check_file(rt, job_id, again["file"], again["spec_id"], again["partition"])
    assert unchecked(rt, job_id, items) == []
    validate(rt, job_id)
    assert all(c["passed"] for c in rt.store.get_job(job_id).state["checks"])
