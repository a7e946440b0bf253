"""A backfill into a table that live ingestion keeps writing to, watched by a reader the whole time.

A live writer thread appends through the plain live path (`Table.append`, one commit each ~50 ms);
a reader thread polls main. Readers must only ever see whole publish chunks, live rows must never be
lost or changed, and where live rows collide with the backfill (committed after the plan) the live
rows win, re-checked at publish.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

import timelake.runner as runner
from tests.runner.scenario import (
    BRANCH_PREFIX, CHUNK_PROPERTY, DEVICES, RANGE_START, STEP, TABLE, Key, assert_same_rows, canonical, day_of,
    json_out, key_counts, keyed, main_rows, merge_reference, publish_snapshots, refs, run_backfill, run_cli, seeded,
    table_of, us,
)
from timelake import connect
from timelake.interfaces.lake import Lake
from timelake.steps.validate import validate

DAYS = 10  # 4 devices x 10 days x 30 min: with one publish commit per day the job runs for seconds
RANGE_END = RANGE_START + timedelta(days=DAYS)
LIVE_START = RANGE_END + timedelta(days=20)  # the live writer's "now", well outside the backfill range
INTERVAL = 0.05
JOB_TIMEOUT = 300  # a guard against a hang, not a speed target: under a loaded CI machine publish may lose many races to the 50 ms live writer


def _collision_keys(rounds: int) -> list[Key]:
    """Source keys that are not on main before the job, in rounds of one key per day of the range: each
    live commit takes one round, so it hits days already written and days not yet written alike."""
    slot = int(STEP.total_seconds() * 1_000_000)
    return [(f"dev-{1 + 2 * (r % 2)}", us(RANGE_START) + day * 86_400_000_000 + (10 + r) * slot)
            for r in range(rounds) for day in range(DAYS)]


class LiveWriter(threading.Thread):
    """Live ingestion: every INTERVAL s one commit of the next minute of readings for every device.

    With ``collide`` set, while ``collide()`` is true each commit also carries one row per day INSIDE
    the backfill range whose key the source also holds (values negative, unlike any source value).
    """

    def __init__(self, warehouse: Path, stop: threading.Event, collisions: list[Key] | None = None,
                 collide: Callable[[], bool] | None = None, interval: float = INTERVAL) -> None:
        super().__init__(daemon=True, name="live-writer")
        self.warehouse, self.stop, self.interval = warehouse, stop, interval
        self.gate = threading.Lock()  # held while a commit is decided and made (see _run_with_live_traffic)
        self.pending = list(collisions or [])
        self.collide = collide
        self.commits: list[tuple[float, pa.Table]] = []  # (time the commit returned, rows)
        self.collided = threading.Event()  # set once a commit carrying in-range rows has returned
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            table = connect(warehouse=self.warehouse).table(TABLE)
            tick = 0
            while not self.stop.wait(self.interval):
                ts = us(LIVE_START) + tick * 60_000_000
                batch = table_of([ts] * DEVICES, [f"dev-{i}" for i in range(DEVICES)],
                                 [-(tick * 10 + i) - 1.0 for i in range(DEVICES)])
                with self.gate:
                    hit = self.collide is not None and bool(self.pending) and self.collide()
                    if hit:
                        hits, self.pending = self.pending[:DAYS], self.pending[DAYS:]
                        batch = pa.concat_tables([batch, table_of([k[1] for k in hits], [k[0] for k in hits],
                                                                   [-1e6 - tick * 10 - j for j in range(len(hits))])])
                    table.append(batch)
                    if hit:
                        self.collided.set()
                self.commits.append((time.monotonic(), batch))
                tick += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def rows(self) -> pa.Table:
        return canonical(pa.concat_tables([b for _, b in self.commits]))

    def in_range_rows(self) -> pa.Table:
        rows = self.rows()
        ts = pc.cast(rows.column("ts"), pa.int64()).to_numpy()
        return rows.filter(pa.array(ts < us(RANGE_END)))


class Reader(threading.Thread):
    """Polls main's backfill range the whole time; keeps every observation for the checks."""

    def __init__(self, warehouse: Path, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="reader")
        self.warehouse, self.stop = warehouse, stop
        self.observations: list[tuple[float, pa.Table]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            table = connect(warehouse=self.warehouse).table(TABLE)
            while not self.stop.is_set():
                rows = table.to_arrow(RANGE_START, RANGE_END)  # one consistent snapshot of main
                self.observations.append((time.monotonic(), canonical(rows)))
                self.stop.wait(0.01)
        except BaseException as exc:
            self.error = exc


@dataclass
class Live:
    lake: Lake
    warehouse: Path
    source: str
    original: pa.Table
    parts: list[pa.Table]
    stop: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def live(tmp_path: Path) -> Live:
    lake, warehouse, original, parts, source = seeded(tmp_path, DAYS)
    return Live(lake, warehouse, source, original, parts)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _run_with_live_traffic(live: Live, publish_by: str | None, collide: bool, mode: str = "merge",
                           interval: float = INTERVAL) -> tuple[str, float, float, LiveWriter, Reader]:
    """Start writer and reader, run the backfill (Python API, in this process), keep both running a
    little after it ends, stop them. Returns the job id, its start and end, the writer and the reader."""
    job_id: list[str] = []
    collisions = _collision_keys(4) if collide else None
    validating = threading.Event()

    def after_plan() -> bool:
        # in-range live rows only after the plan and before validation: each of them lands after the
        # plan's base snapshot, so only publish's re-check can keep it winning. (A live append racing
        # the publish commit itself would be the live writer's own duplicate, which no backfill can
        # prevent, so the last colliding commit must have returned before validation starts.)
        return bool(job_id) and not validating.is_set() and live.lake.runtime.store.get_job(job_id[0]).phase in (
            "planned", "writing", "written", "staged")

    writer = LiveWriter(live.warehouse, live.stop, collisions, after_plan if collide else None, interval)

    def gated_validate(*args: object, **kwargs: object) -> object:
        if collide:
            # the job alone may outrun the live writer's next tick: hold validation until at least one
            # colliding commit has landed after the plan, so the premise never depends on timing
            writer.collided.wait(30)
        with writer.gate:  # waits for a live commit in flight; none collides after this
            validating.set()
        return validate(*args, **kwargs)
    reader = Reader(live.warehouse, live.stop)
    writer.start()
    reader.start()
    try:
        _wait_for(lambda: (len(writer.commits) >= 2 and len(reader.observations) >= 2) or not _alive(writer, reader),
                  "live traffic to start")
        started = time.monotonic()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runner, "validate", gated_validate)
            bounds = {"start": RANGE_START.isoformat(), "end": RANGE_END.isoformat()} if mode == "replace" else {}
            job = live.lake.table(TABLE).backfill(live.source, publish_by=publish_by, max_concurrency=1, mode=mode, **bounds)
            job_id.append(job.id)
            job.wait(JOB_TIMEOUT)
        ended = time.monotonic()
        commits, observations = len(writer.commits), len(reader.observations)
        _wait_for(lambda: (len(writer.commits) >= commits + 2 and len(reader.observations) >= observations + 2)
                  or not _alive(writer, reader), "live traffic after the job")
    finally:
        live.stop.set()
        writer.join(30)
        reader.join(30)
    assert writer.error is None, f"live writer failed: {writer.error!r}"
    assert reader.error is None, f"reader failed: {reader.error!r}"
    # the premise: the job really ran while live commits and reads were happening
    assert sum(started < t < ended for t, _ in writer.commits) >= 1, f"job took {ended - started:.2f} s"
    assert sum(started < t < ended for t, _ in reader.observations) >= 1
    return job.id, started, ended, writer, reader


def _alive(*threads: threading.Thread) -> bool:
    return all(t.is_alive() for t in threads)


def _by_day(keys: set[Key]) -> dict[int, set[Key]]:
    days: dict[int, set[Key]] = {}
    for k in keys:
        days.setdefault(day_of(k[1]), set()).add(k)
    return days


def _check_observations(reader: Reader, reference: dict[Key, float], protected: dict[Key, float],
                        backfilled: dict[int, set[Key]], whole_job: bool) -> None:
    """Every observation: no duplicate key, every row that was on main before the job there unchanged,
    every other row not from the backfill (live) with its final value, and per day the backfilled keys
    either all absent or all present (with their final values). Complete days stay complete."""
    from_backfill = set().union(*backfilled.values())
    complete_before: set[int] = set()
    for n, (_, rows) in enumerate(reader.observations):
        counts = key_counts(rows)
        dupes = [k for k, c in counts.items() if c > 1]
        assert not dupes, f"observation {n}: duplicate keys {dupes[:3]}"
        values = keyed(rows)
        lost = [k for k, v in protected.items() if values.get(k) != v]
        assert not lost, f"observation {n}: pre-existing rows missing or changed, e.g. {lost[:3]}"
        overwritten = [k for k in values.keys() - from_backfill if values[k] != reference.get(k)]
        assert not overwritten, f"observation {n}: rows not from the backfill changed or unknown, e.g. {overwritten[:3]}"
        complete = set()
        for day, keys in backfilled.items():
            present = keys & values.keys()
            assert len(present) in (0, len(keys)), (
                f"observation {n}: day {day} partially published ({len(present)} of {len(keys)} rows)")
            if present:
                complete.add(day)
                wrong = [k for k in present if values[k] != reference[k]]
                assert not wrong, f"observation {n}: published rows with wrong values, e.g. {wrong[:3]}"
        assert complete_before <= complete, f"observation {n}: published day(s) {complete_before - complete} vanished"
        if whole_job:
            assert complete in (set(), set(backfilled)), f"observation {n}: only days {sorted(complete)} published"
        complete_before = complete
    first, last = reader.observations[0][1], reader.observations[-1][1]
    assert not (key_counts(first).keys() & from_backfill), "the first read already saw the backfill"
    assert from_backfill <= key_counts(last).keys(), "the last read did not see the whole backfill"


def _check_history(lake: Lake, job_id: str, backfilled: dict[int, set[Key]], chunks: int) -> None:
    """Deterministic twin of the reader: main as of each of the job's publish commits holds whole days
    only, and each commit adds exactly the days of its own chunk."""
    publishes = publish_snapshots(lake, job_id)
    assert len(publishes) == chunks
    assert len({p.summary[CHUNK_PROPERTY] for p in publishes}) == chunks
    iceberg = lake.table(TABLE).iceberg
    in_range = And(GreaterThanOrEqual("ts", RANGE_START.isoformat()), LessThan("ts", RANGE_END.isoformat()))
    done: set[int] = set()
    for p in publishes:
        rows = iceberg.scan(row_filter=in_range, snapshot_id=p.snapshot_id).to_arrow()
        keys = key_counts(rows).keys()
        complete = set()
        for day, day_keys in backfilled.items():
            present = len(day_keys & keys)
            assert present in (0, len(day_keys)), f"snapshot {p.snapshot_id}: day {day} has {present} of {len(day_keys)}"
            if present:
                complete.add(day)
        if chunks > 1:
            chunk_day = day_of(us(datetime.fromisoformat(p.summary[CHUNK_PROPERTY].replace("Z", "+00:00"))))
            assert complete - done == {chunk_day}, f"publish commit {p.summary[CHUNK_PROPERTY]} added days {complete - done}"
        assert done < complete, f"publish commit {p.summary[CHUNK_PROPERTY]} added no day"
        done = complete
    assert done == set(backfilled)


def _check_final(live: Live, job_id: str, writer: LiveWriter) -> tuple[dict[Key, float], dict[Key, float], dict[int, set[Key]]]:
    """Main at the end: original + every live row unchanged + the backfill; no duplicates; job closed.
    Returns the final values, the in-range rows that were on main before the job, and per day the
    keys the backfill added."""
    live_rows = writer.rows()
    existing = pa.concat_tables([canonical(live.original), live_rows])
    reference = merge_reference(existing, live.parts)
    final = main_rows(live.lake)
    assert_same_rows(final, reference)
    final_values = keyed(final)
    live_values = keyed(live_rows)
    assert all(final_values.get(k) == v for k, v in live_values.items()), "a live row was lost or changed"
    job = live.lake.job(job_id)
    report = job.report()
    assert report["phase"] == "published"
    assert report["rows_written"] == reference.num_rows - existing.num_rows
    source_keys = key_counts(pa.concat_tables(live.parts)).keys()
    assert report["rows_conflicting_existing"] == len(source_keys & key_counts(existing).keys())
    assert BRANCH_PREFIX + job_id not in refs(live.lake)
    assert live.lake.runtime.store.leases() == []
    ref_values = keyed(reference)
    protected = {k: v for k, v in keyed(live.original).items() if RANGE_START <= _dt(k[1]) < RANGE_END}
    backfilled_keys = {k for k in ref_values if RANGE_START <= _dt(k[1]) < RANGE_END} - keyed(existing).keys()
    return ref_values, protected, _by_day(backfilled_keys)


def _dt(ts_us: int) -> datetime:
    return datetime.fromtimestamp(ts_us / 1e6, tz=UTC)


@pytest.mark.parametrize("publish_by", ["day", None], ids=["publish_by_day", "one_commit"])
def test_live_appends_during_backfill_survive_and_readers_see_only_whole_chunks(live: Live, publish_by: str | None) -> None:
    job_id, _, _, writer, reader = _run_with_live_traffic(live, publish_by, collide=False)
    assert len(writer.in_range_rows()) == 0
    reference, protected, backfilled = _check_final(live, job_id, writer)
    assert len(backfilled) == DAYS
    assert live.lake.job(job_id).report()["rows_conflicting_at_publish"] == 0
    _check_observations(reader, reference, protected, backfilled, whole_job=publish_by is None)
    _check_history(live.lake, job_id, backfilled, DAYS if publish_by else 1)


def test_live_rows_colliding_with_the_backfill_after_the_plan_win(live: Live) -> None:
    job_id, _, _, writer, reader = _run_with_live_traffic(live, "day", collide=True)
    collided = writer.in_range_rows()
    assert collided.num_rows >= DAYS, "no live commit collided with the backfill after the plan"
    assert not key_counts(collided).keys() & key_counts(live.original).keys()
    assert key_counts(collided).keys() <= key_counts(pa.concat_tables(live.parts)).keys()
    reference, protected, backfilled = _check_final(live, job_id, writer)
    final = keyed(main_rows(live.lake))
    assert all(final[k] == v for k, v in keyed(collided).items()), "a staged row replaced a live row"
    _check_observations(reader, reference, protected, backfilled, whole_job=False)
    _check_history(live.lake, job_id, backfilled, DAYS)


@pytest.mark.parametrize("pause_at", ["plan.done", "write.unit:3", "stage.done"])
def test_live_rows_committed_at_any_point_after_the_plan_win_at_publish(live: Live, pause_at: str) -> None:
    """Deterministic: the job process dies at ``pause_at``; live ingestion then commits rows whose keys
    the (partly) written and staged data also holds, in days already written and days not yet
    written; the resumed job must publish with the live rows winning, never fail or duplicate."""
    crashed = run_backfill(live.warehouse, live.source, crash_at=pause_at)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    [job] = live.lake.jobs(TABLE)
    keys = _collision_keys(2)
    assert not set(keys) & key_counts(live.original).keys()
    collided = table_of([k[1] for k in keys], [k[0] for k in keys], -1e6 - np.arange(len(keys)))
    live.lake.table(TABLE).append(collided)

    resumed = run_cli(live.warehouse, "backfill", "resume", job.id, "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json_out(resumed)
    assert report["phase"] == "published"
    existing = pa.concat_tables([canonical(live.original), canonical(collided)])
    reference = merge_reference(existing, live.parts)
    assert_same_rows(main_rows(live.lake), reference)
    assert report["rows_written"] == reference.num_rows - existing.num_rows
    source_keys = key_counts(pa.concat_tables(live.parts)).keys()
    assert report["rows_conflicting_existing"] == len(source_keys & key_counts(existing).keys())
    assert len(publish_snapshots(live.lake, job.id)) == 1
    assert live.lake.runtime.store.leases() == []
    assert BRANCH_PREFIX + job.id not in refs(live.lake)


def test_replace_under_live_traffic_keeps_every_live_row_and_swaps_each_day_whole(live: Live) -> None:
    """Replace, one commit per day, while live ingestion keeps committing (some of it inside the
    range, with keys the source also holds): every live row survives unchanged and wins over the
    source; each reader sees a day either as main held it before or as the job left it, never a mix.

    The live writer commits every 0.3 s here, not every 50 ms: a replace commit (pyiceberg's range
    delete plus the append) takes 0.1-0.3 s on this machine, and a writer that commits more often than
    that can win every race until publish gives up (the README says so)."""
    job_id, _, _, writer, reader = _run_with_live_traffic(live, "day", collide=True, mode="replace", interval=0.3)
    collided = writer.in_range_rows()
    assert collided.num_rows >= DAYS, "no live commit collided with the backfill after the plan"
    before = live.original.filter(pc.less(live.original.column("ts"), pa.scalar(RANGE_START, pa.timestamp("us", tz="UTC"))))
    reference = merge_reference(pa.concat_tables([canonical(before), writer.rows()]), live.parts)
    assert_same_rows(main_rows(live.lake), reference)
    report = live.lake.job(job_id).report()
    assert report["phase"] == "published" and report["rows_conflicting_at_publish"] == collided.num_rows
    assert len({p.summary[CHUNK_PROPERTY] for p in publish_snapshots(live.lake, job_id)}) == DAYS
    assert BRANCH_PREFIX + job_id not in refs(live.lake) and live.lake.runtime.store.leases() == []

    final, live_values = keyed(reference), keyed(collided)
    in_range = {k: v for k, v in final.items() if RANGE_START <= _dt(k[1]) < RANGE_END}
    old_days = _by_day(set(keyed(live.original)) & {k for k in keyed(live.original) if _dt(k[1]) >= RANGE_START})
    new_days = _by_day(set(in_range) - set(live_values))
    seen: dict[Key, float] = {}
    for n, (_, rows) in enumerate(reader.observations):
        values = keyed(rows)  # raises on a duplicate key
        live_now = {k: v for k, v in values.items() if k in live_values}
        assert all(v == live_values[k] for k, v in live_now.items()), f"observation {n}: a live row changed"
        assert set(seen) <= set(live_now), f"observation {n}: a live row seen before is gone"
        seen = live_now
        for day in set(old_days) | set(new_days):
            keys = {k for k in values if day_of(k[1]) == day and k not in live_values}
            old, new = old_days.get(day, set()), new_days.get(day, set())
            assert keys in (old, new), (
                f"observation {n}: day {day} holds {len(keys)} rows, neither the {len(old)} of main before "
                f"the job nor the {len(new)} it publishes")
            if keys == new and keys != old:
                assert all(values[k] == in_range[k] for k in keys), f"observation {n}: day {day} has wrong values"
    assert set(seen) == set(live_values), "the last read did not see every live row of the range"
