"""A unit reads only its own rows from the spill: the bytes all writes read stay at the bytes spilled,
whatever the number of units per partition, and every unit gets exactly its series."""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import SCHEMA, TODAY, make_readings, recent, sort_rows
from timelake.adapters.objects import ArrowObjects
from timelake.model.spec import JobSpec
from timelake.steps.plan import cut, pending_pieces, plan, scan
from timelake.steps.scan import read_result
from timelake.steps.write import write_unit

OBJECTS = ArrowObjects()  # what the runtime opens files with, for the spill tests that need no lake


def _spill_and_write(lake, target_file_size: str, folder: Path | None = None):
    """Scan 2 days of 200 devices, cut, write every unit; (bytes spilled, bytes the writes read, units, source).
    With ``folder``, the source is a Parquet file per device there (each source batch is one series)."""
    lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                      target_file_size=target_file_size)
    source = make_readings(recent(4), days=2, devices=200, step_minutes=1)
    rt = lake.runtime
    given = source
    if folder is not None:
        folder.mkdir()
        for device in set(source.column("device_id").to_pylist()):
            pq.write_table(source.filter(pc.equal(source.column("device_id"), device)), folder / f"{device}.parquet")
        given = None
    job = lake.create_job(JobSpec(table="iot.sensor", source=str(folder / "*.parquet") if folder else "<pyarrow.Table>"))
    plan(rt, job.id, given)
    tasks = pending_pieces(rt, job.id)
    for task in tasks:
        scan(rt, job.id, task, given)
    spilled = sum(p.spill_bytes for t in tasks for p in read_result(rt, job.id, t).partitions.values())
    cut(rt, job.id)
    read = sum(write_unit(rt, job.id, u.unit_id)["spill_bytes_read"] for u in rt.store.units(job.id))
    return spilled, read, rt.store.units(job.id), source


def _rows(units, columns=None) -> pa.Table:
    return pa.concat_tables([pq.read_table(u.result["path"], columns=columns) for u in units if u.result["path"]])


@pytest.mark.parametrize(("target_file_size", "units_a_day"), [("128MB", 1), ("48KB", 20)])
@pytest.mark.parametrize("layout", ["batches_of_many_series", "a_file_per_series"])
def test_writes_read_each_spilled_byte_once_at_any_number_of_units(lake, tmp_path, target_file_size, units_a_day, layout):
    folder = tmp_path / "devices" if layout == "a_file_per_series" else None
    spilled, read, units, source = _spill_and_write(lake, target_file_size, folder)
    days = {u.info["partition"] for u in units}
    assert min(sum(1 for u in units if u.info["partition"] == d) for d in days) >= units_a_day
    assert 0 < read <= 1.1 * spilled, f"{len(units)} units read {read:,} bytes of {spilled:,} spilled"
    assert sort_rows(_rows(units).select(SCHEMA.names).cast(SCHEMA)).equals(sort_rows(source))


def test_each_unit_holds_only_its_own_series_from_a_run_of_buckets(lake):
    _, _, units, _ = _spill_and_write(lake, "48KB")
    assert len(units) > 40
    owner: dict[tuple[str, str], str] = {}
    for day in {u.info["partition"] for u in units}:
        runs = sorted((min(u.info["buckets"]), max(u.info["buckets"])) for u in units if u.info["partition"] == day)
        assert all(hi < next_lo for (_, hi), (next_lo, _) in pairwise(runs)), "units take contiguous bucket runs"
    for unit in units:
        for device in set(_rows([unit], ["device_id"]).column(0).to_pylist()):
            assert owner.setdefault((unit.info["partition"], device), unit.unit_id) == unit.unit_id


def test_a_unit_never_holds_more_rows_than_a_writer_can(lake, monkeypatch):
    """Rows that compress well would make a 128 MB file of far more rows than the write Lambda holds:
    the cut splits by rows too, so no unit exceeds MAX_UNIT_ROWS."""
    import timelake.steps.plan as plan_module

    monkeypatch.setattr(plan_module, "MAX_UNIT_ROWS", 5_000)
    _, read, units, source = _spill_and_write(lake, "128MB")
    per_day = {}
    for unit in units:
        per_day.setdefault(unit.info["partition"], []).append(unit.result["rows_in"])
    assert all(len(rows) >= 2 and max(rows) <= 5_000 for rows in per_day.values()), per_day
    assert sum(sum(rows) for rows in per_day.values()) == source.num_rows and read > 0


def test_a_series_lands_in_the_same_bucket_whether_read_as_text_or_dictionary_encoded():
    """Parquet sources give series keys dictionary-encoded, other sources as text: tasks of one job
    must agree on each series' bucket, or a unit would miss rows of its series."""
    from timelake.steps.scan import series_bucket

    devices = pa.array([f"device-{i % 97}" for i in range(1000)], pa.large_string())
    plain = series_bucket(pa.table({"device_id": devices}), ("device_id",))
    coded = series_bucket(pa.table({"device_id": pc.dictionary_encode(devices)}), ("device_id",))
    assert plain.tolist() == coded.tolist() and len(set(plain.tolist())) > 50


@pytest.mark.parametrize("order", ["a_run_per_series", "series_interleaved"])
def test_small_runs_share_record_batches_and_a_read_still_gets_only_its_buckets(tmp_path, order):
    """Runs of a few rows each (a file per device, cut by day) are joined into record batches of up to
    ``join_bytes``, each run's rows indexed within its batch: fewer batches than runs, the same rows read
    back per bucket and partition (two partitions share the task's file), and a read of some buckets
    fetches at most a joined batch more at each end. Rows held in runs of one series are moved as runs;
    rows of interleaved series are ordered by bucket when held: the same rows come back either way."""
    from timelake.steps import spill
    from timelake.steps.scan import series_bucket

    per_series = order == "a_run_per_series"
    source = make_readings(recent(2), days=1, devices=120, step_minutes=5 if per_series else 10)
    keys = ["device_id", "ts"] if per_series else ["ts", "device_id"]
    source = source.take(pc.sort_indices(source, [(k, "ascending") for k in keys]))
    buckets = series_bucket(source, ("device_id",))
    halves = [0, source.num_rows // 2, source.num_rows]  # two batches held: a bucket's runs come from both
    other = pa.table({"ts": source.column("ts"), "device_id": pa.array(["other"] * source.num_rows),
                      "value": source.column("value")}, schema=SCHEMA)
    written = {}
    for join_bytes in (0, 64 << 10):
        dictionaries = spill.Dictionaries(SCHEMA, ("device_id",))
        uri = str(tmp_path / f"join-{join_bytes}-{order}.arrow")
        file = spill.SpillFile(uri, dictionaries, join_bytes, objects=OBJECTS)
        for partition, rows in (((0, 1), source), ((0, 2), other)):
            coded = dictionaries.code(rows)
            for lo, hi in pairwise(halves):
                file.hold(coded.slice(lo, hi - lo), [partition], np.zeros(hi - lo, dtype=np.int64), buckets[lo:hi],
                          coded.nbytes * (hi - lo) // coded.num_rows)
            file.flush()
        runs = sum(len(block) for block in file.partitions[(0, 1)].index)
        size = file.close()[(0, 1)]
        batches = pa.ipc.open_stream(pa.OSFile(uri)).read_all().to_batches()
        written[join_bytes] = (uri, size, runs, len(batches))
    (_, _, runs, batches_apart), (joined_uri, joined_size, _, batches_joined) = written[0], written[64 << 10]
    assert batches_apart > runs > 100 and batches_joined < runs / 5
    present = sorted(set(buckets.tolist()))
    for wanted in (present[:1], present[10:40], present[-5:], present):
        expected = source.filter(pa.array(np.isin(buckets, wanted)))
        counter = spill.SpillRead()
        got = pa.concat_tables(list(spill.read([joined_uri], (0, 1), wanted, counter, objects=OBJECTS))).cast(SCHEMA)
        # one bucket's rows come back in the order they came (a later row of a key is its correction)
        assert got.equals(expected) if len(wanted) == 1 else sort_rows(got).equals(sort_rows(expected))
        own = expected.num_rows * 20  # spilled bytes a row: ts, value and the series code
        assert counter.bytes_read <= own + 2 * (64 << 10) + (16 << 10), (wanted[:3], counter.bytes_read, own)
    other_rows = pa.concat_tables(spill.read([joined_uri], (0, 2), None, objects=OBJECTS))  # the other partition of the same file
    assert other_rows.column("device_id").cast(pa.string()).unique().to_pylist() == ["other"]
    assert list(spill.read([joined_uri], (0, 3), None, objects=OBJECTS)) == []
    assert joined_size < written[0][1]


def test_a_scan_task_runs_with_the_collector_paused_and_restores_it(lake, tmp_path):
    """Inside a scan task the collector does not run (its passes over the whole heap would hold the other
    scan threads), however much the task allocates; outside it, it runs as before."""
    import gc
    import sys

    folder = tmp_path / "devices"
    lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day")
    folder.mkdir()
    source = make_readings(recent(4), days=2, devices=40, step_minutes=30)
    for device in set(source.column("device_id").to_pylist()):
        pq.write_table(source.filter(pc.equal(source.column("device_id"), device)), folder / f"{device}.parquet")
    rt = lake.runtime
    job = lake.create_job(JobSpec(table="iot.sensor", source=str(folder / "*.parquet")))
    plan(rt, job.id, None)
    inside, outside = [], []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            frame, names = sys._getframe(1), set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back
            (inside if "scan_task" in names else outside).append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(20, 5, 5)  # a collection every few allocations: the task would set off hundreds
    gc.callbacks.append(note)
    try:
        for task in pending_pieces(rt, job.id):
            scan(rt, job.id, task, None)
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
    assert gc.isenabled() and outside and not inside, (len(outside), len(inside))
    assert sum(read_result(rt, job.id, t).rows_in_source for t in range(len(rt.store.get_job(job.id).state["scan_tasks"]))) \
        == source.num_rows


def test_a_spill_of_another_layout_is_refused_with_what_to_do(tmp_path):
    """A job scanned by an earlier version and resumed by this one finds an index it cannot read (the
    first layout had the dictionary bytes where this one has its format mark): one clear error, not rows
    read from the wrong offsets."""
    from timelake.errors import BackfillError
    from timelake.steps import spill

    source = make_readings(recent(2), days=1, devices=3, step_minutes=60)
    dictionaries = spill.Dictionaries(SCHEMA, ("device_id",))
    uri = str(tmp_path / "task.arrow")
    file = spill.SpillFile(uri, dictionaries, objects=OBJECTS)
    file.hold(dictionaries.code(source), [(0, 1)], np.zeros(source.num_rows, dtype=np.int64), None, source.nbytes)
    file.close()
    assert pa.concat_tables(spill.read([uri], (0, 1), None, objects=OBJECTS)).num_rows == source.num_rows
    index = Path(uri + spill.INDEX_SUFFIX)
    body = bytearray(index.read_bytes())
    body[24:32] = (4_321).to_bytes(8, "little")  # an index of the first layout: dictionary bytes in that place
    index.write_bytes(bytes(body))
    with pytest.raises(BackfillError, match=r"task\.arrow was spilled by an earlier version .* abort the job and submit it again"):
        list(spill.read([uri], (0, 1), None, objects=OBJECTS))


@pytest.mark.parametrize("layout", ["runs_of_one_series", "rows_interleaved", "time_ordered_one_day", "time_ordered_days"])
def test_rows_and_sums_per_partition_and_bucket_are_the_same_counted_per_run_or_per_row(layout):
    """A batch of a file per series is counted per run of one partition and bucket, a batch in time order per
    run of one partition with its buckets per row, any other per row: either way the rows per partition, per
    (partition, bucket) and the value sums come out exact."""
    from timelake.model.layout import RUN_ROWS, run_starts
    from timelake.steps.scan import SERIES_BUCKETS, _partition_counts

    rng = np.random.default_rng(7)
    codes = np.repeat(rng.integers(0, 30, 400), rng.integers(300, 700, 400))  # runs of one partition
    buckets = np.repeat(rng.integers(0, SERIES_BUCKETS, len(codes) // 2000 + 1), 2000)[:len(codes)]  # and of one bucket
    values = rng.normal(20, 5, len(codes))
    if layout == "rows_interleaved":
        order = rng.permutation(len(codes))
        codes, buckets, values = codes[order], buckets[order], values[order]
    elif layout.startswith("time_ordered"):  # a day's rows together (one day, or a few), the series every row
        days = 1 if layout == "time_ordered_one_day" else 5
        codes = np.repeat(rng.choice(30, days, replace=False), len(codes) // days + 1)[:len(codes)]
        buckets = rng.integers(0, SERIES_BUCKETS, len(codes))
    per_run = len(run_starts(codes, buckets)) <= len(codes) // RUN_ROWS
    assert per_run == (layout == "runs_of_one_series")
    per_code, counts, sums = _partition_counts(codes, buckets, values, 30)
    assert per_code.tolist() == np.bincount(codes, minlength=30).tolist()
    assert (counts == np.bincount(codes * SERIES_BUCKETS + buckets, minlength=30 * SERIES_BUCKETS).reshape(30, -1)).all()
    assert np.allclose(sums, np.bincount(codes, weights=values, minlength=30), rtol=1e-12)
    assert counts.dtype == per_code.dtype == np.int64
    unbucketed, none, _ = _partition_counts(codes, None, None, 30)
    assert unbucketed.tolist() == per_code.tolist() and none is None


def test_a_unit_read_in_several_reads_of_several_files_gets_each_row_with_its_own_series(lake, tmp_path, monkeypatch):
    """Scan tasks that flush several times leave each unit several reads of each task's file, and each file
    codes its series by its own dictionary (the same code is another device in another file): the writer
    decodes a file's reads together, and every row comes back with its own device."""
    import timelake.steps.scan as scan_module
    from timelake.steps import spill

    import timelake.steps.plan as plan_module

    monkeypatch.setattr(scan_module, "HELD_BYTES", 256 << 10)
    monkeypatch.setattr(scan_module, "COALESCE_ROWS", 4096)
    monkeypatch.setattr(plan_module, "MIN_TASK_BYTES", 64 << 10)
    reads: list[list[int]] = []  # per unit, the id of the dictionaries each of its reads came with
    read_coded = spill.read_coded

    def counted(*args, **kwargs):
        reads.append([])
        for rows, dictionaries in read_coded(*args, **kwargs):
            reads[-1].append(id(dictionaries))
            yield rows, dictionaries

    monkeypatch.setattr(spill, "read_coded", counted)
    _, _, units, source = _spill_and_write(lake, "128MB", tmp_path / "devices")
    assert max(len(set(unit)) for unit in reads) >= 2, "a unit reads the files of several tasks"
    assert max(max(unit.count(file) for file in unit) for unit in reads if unit) >= 2, "a file in several reads"
    assert sort_rows(_rows(units).select(SCHEMA.names).cast(SCHEMA)).equals(sort_rows(source))


@pytest.mark.parametrize("kept", [True, False])
def test_a_spill_file_written_again_with_other_series_is_read_with_its_new_dictionary(tmp_path, monkeypatch, kept):
    """A scan task run again (a resume) spills to the same path, maybe with other series: the parsed
    dictionaries a process keeps are keyed by their bytes, so a unit never decodes codes by the old ones.
    Dictionaries past `CACHED_DICTIONARY_BYTES` (millions of series) are parsed at each read, not kept."""
    from timelake.steps import spill

    if not kept:
        monkeypatch.setattr(spill, "CACHED_DICTIONARY_BYTES", 16)
    spill._parsed.cache_clear()
    uri = str(tmp_path / "task.arrow")
    for devices in (["dev-a", "dev-b"], ["dev-c", "dev-d"], ["dev-b", "dev-a"]):  # same lengths: same file size
        rows = pa.table({"ts": pa.array([1_000, 2_000], pa.timestamp("us", tz="UTC")), "device_id": devices,
                         "value": [1.0, 2.0]}, schema=SCHEMA)
        dictionaries = spill.Dictionaries(SCHEMA, ("device_id",))
        file = spill.SpillFile(uri, dictionaries, objects=OBJECTS)
        file.hold(dictionaries.code(rows), [(0, 1)], np.zeros(2, dtype=np.int64), None, rows.nbytes)
        file.close()
        got = pa.concat_tables(spill.read([uri], (0, 1), None, objects=OBJECTS))
        assert got.column("device_id").cast(pa.string()).to_pylist() == devices
    assert spill._parsed.cache_info().currsize == (3 if kept else 0)


def test_a_unit_reading_files_whose_dictionaries_are_equal_but_not_adjacent_keeps_rows_in_line(lake, tmp_path, monkeypatch):
    """Three tasks spill every day; the first and third code their devices alike (one parsed dictionary is
    shared), the second in the opposite order. A unit reads the three files in turn, each in several
    reads: their codes are decoded a file at a time in that turn, so every value stays with its device."""
    import timelake.steps.plan as plan_module
    import timelake.steps.scan as scan_module

    monkeypatch.setattr(scan_module, "HELD_BYTES", 64 << 10)
    monkeypatch.setattr(scan_module, "COALESCE_ROWS", 2048)
    monkeypatch.setattr(plan_module, "MIN_TASK_BYTES", 1)
    lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day")
    source = make_readings(recent(3), days=2, devices=45, step_minutes=5, seed=3)
    folder = tmp_path / "thirds"
    folder.mkdir()
    minute = pc.cast(pc.cast(source.column("ts"), pa.int64()), pa.int64()).to_numpy() // 300_000_000
    written = []
    for third in range(3):
        rows = source.filter(pa.array(minute % 3 == third))
        # the first and last file hold the same 30 devices; the middle one as many rows of others, in the
        # opposite order: another dictionary, and another run of devices
        devices = [f"d{i:02d}" for i in (range(30) if third != 1 else [*range(0, 30, 2), *range(30, 45)])]
        rows = rows.filter(pc.is_in(rows.column("device_id"), pa.array(devices)))
        by_device = [("device_id", "descending" if third == 1 else "ascending"), ("ts", "ascending")]
        rows = rows.take(pc.sort_indices(rows, sort_keys=[by_device[1], by_device[0]]))  # time order, devices within
        pq.write_table(rows, folder / f"part-{third}.parquet", compression="none", use_dictionary=["device_id"])
        written.append(rows)
    rt = lake.runtime
    job = lake.create_job(JobSpec(table="iot.sensor", source=str(folder / "*.parquet")))
    plan(rt, job.id, None)
    tasks = pending_pieces(rt, job.id)
    for task in tasks:
        scan(rt, job.id, task, None)
    cut(rt, job.id)
    for unit in rt.store.units(job.id):
        write_unit(rt, job.id, unit.unit_id)
    units = rt.store.units(job.id)
    assert len(tasks) == 3 and max(len(u.info["spill"]) for u in units) == 3
    assert sort_rows(_rows(units).select(SCHEMA.names).cast(SCHEMA)).equals(sort_rows(pa.concat_tables(written)))


def test_a_published_job_leaves_no_spill(lake, tmp_path):
    """The spill goes once main holds the job's rows (while the rest of the publish runs, on a thread of
    its own): a published job leaves nothing it spilled."""
    folder = tmp_path / "devices"
    folder.mkdir()
    source = make_readings(recent(4), days=2, devices=40, step_minutes=5)
    for device in set(source.column("device_id").to_pylist()):
        pq.write_table(source.filter(pc.equal(source.column("device_id"), device)), folder / f"{device}.parquet")
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day")
    job = table.backfill(source=str(folder / "*.parquet"), max_concurrency=2).wait()
    assert job.record().phase == "published"
    assert any(u.info.get("spill") for u in lake.runtime.store.units(job.id)), "the job spilled nothing to drop"
    scratch = Path(lake.runtime.config.staging.removeprefix("file://"), job.id)
    assert not (scratch / "spill").exists()
    assert sort_rows(table.to_arrow()).equals(sort_rows(source))


class _NoonOfTheSessionsDay(datetime):
    """The plan's clock for a test whose hour tier must start on a day of its data, also after midnight."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
        return TODAY + timedelta(hours=12)


@pytest.mark.parametrize("partition_by", ["hour", {"P2D": "hour", None: "day"}])
def test_a_file_per_series_is_cut_a_run_at_a_time_into_the_same_partitions_counts_and_spill_as_row_by_row(
        lake, tmp_path, monkeypatch, partition_by):
    """Batches of files per device are cut, counted and spilled a run of one hour (or day) and device at a
    time: against the same job cut row by row (as batches of many series are), every partition's rows,
    buckets, sums and spilled bytes, the days, the bounds and the rows outside the job's range are the
    same, and every unit writes the same rows. Hourly partitions and a table whose tiers change from hours
    to days within the source take runs of an hour; the job's range cuts rows off both ends."""
    from timelake.steps import plan as planning
    from timelake.steps import scan as scanning

    folder = tmp_path / "devices"
    folder.mkdir()
    begin = np.datetime64(recent(3), "us")
    times = begin + np.arange(2 * 8_640) * np.timedelta64(10_000_000, "us")  # two days, a row every 10 s
    for device in range(12):
        rng = np.random.default_rng(device)
        pq.write_table(pa.table({"ts": pa.array(times, pa.timestamp("us", tz="UTC")), "device_id": [f"d{device:02d}"] * len(times),
                                 "value": rng.normal(20, 5, len(times))}), folder / f"d{device:02d}.parquet")

    counted = scanning._partition_counts
    per_run: list[bool] = []

    def job(row_by_row: bool) -> tuple[list[dict], dict[str, pa.Table]]:
        monkeypatch.setattr(planning, "datetime", _NoonOfTheSessionsDay)  # tiers count back from the data's day
        if row_by_row:
            monkeypatch.setattr(scanning, "_series_indices", lambda rows, key: None)
        monkeypatch.setattr(scanning, "_partition_counts", lambda *args: per_run.append(args[-1] is not None) or counted(*args))
        rt, table = lake.runtime, f"iot.sensor{int(row_by_row)}"
        lake.create_table(table, schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by=partition_by)
        made = lake.create_job(JobSpec(table=table, source=str(folder / "*.parquet"), start=f"{recent(3)}T05:00:00Z",
                                       end=f"{recent(2)}T20:00:00Z"))
        plan(rt, made.id)
        tasks = pending_pieces(rt, made.id)
        for task in tasks:
            scan(rt, made.id, task)
        results = []
        for task in tasks:
            found = read_result(rt, made.id, task).to_json()
            for part in found["partitions"]:
                part.pop("spill")  # of each job's own
            results.append(found)
        cut(rt, made.id)
        written = {u.unit_id: sort_rows(pq.read_table(write_unit(rt, made.id, u.unit_id)["path"])) for u in rt.store.units(made.id)}
        monkeypatch.undo()
        return results, written

    by_run = job(False)
    assert per_run and all(per_run)  # every batch was cut a run at a time
    per_run.clear()
    by_row = job(True)
    assert per_run and not any(per_run)
    sums = [[part.pop("check_sum") for part in result["partitions"]] for result in by_run[0] + by_row[0]]
    assert sums[:len(by_run[0])] == [pytest.approx(s, rel=1e-12) for s in sums[len(by_run[0]):]]  # summed in other runs
    assert by_run[0] == by_row[0]
    assert sum(r["rows_outside_range"] for r in by_run[0]) == 12 * (5 + 4) * 360  # the first five hours and the last four
    assert by_run[1].keys() == by_row[1].keys() and len(by_run[1]) > 20
    assert all(by_run[1][unit].equals(by_row[1][unit]) for unit in by_run[1])
