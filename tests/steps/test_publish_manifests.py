"""Publish lists copies of the staging manifests instead of encoding the same entries again.

Stage writes its entries without snapshot id and sequence numbers (Iceberg v2 inheritance); when a
chunk adds exactly the staged files, the publish snapshot lists byte copies of those manifests as its
own, so every entry read from main belongs to the publish commit. Anything else (a stage without
inheritable entries, several chunks, files rewritten for live conflicts) writes the entries anew.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import SCHEMA, recent, sort_rows, stage_job
from timelake.followup import completion, coverage
from timelake.model.commit import INHERITED_IDS, JOB_PROPERTY, staged_manifests
from timelake.steps import stage as stage_step
from timelake.steps.publish import publish
from timelake.steps.validate import validate


def _bytes(path: str) -> bytes:
    return Path(path.removeprefix("file://")).read_bytes()


def _publish_snapshot(table, job_id: str):
    [snapshot] = [s for s in table.snapshots() if (s.summary or {}).get(JOB_PROPERTY) == job_id]
    return snapshot


def _tiered(lake):
    return lake.create_table("iot.tiered", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                             partition_by={"P90D": "day", "P2Y": "month", None: "year"}, retention="P5Y")


@pytest.mark.parametrize("tiers", [False, True], ids=["one spec", "three specs"])
def test_publish_lists_copies_of_the_staging_manifests(lake, sensor, readings, monkeypatch, tiers):
    table = _tiered(lake) if tiers else sensor
    name = "iot.tiered" if tiers else "iot.sensor"
    table.append(readings(recent(40), days=2, devices=2))  # main is not empty: the branch forks from it
    source = pa.concat_tables([readings(recent(30), days=3, devices=2), readings(recent(200), days=2, devices=2),
                               readings("2023-03-10", days=2, devices=2)] if tiers else [readings(recent(30), days=3, devices=2)])
    rt = lake.runtime
    job_id = stage_job(lake, source, table=name)
    validate(rt, job_id)
    iceberg = table.refresh().iceberg
    staged_id = rt.store.get_job(job_id).state["staged_snapshot_id"]
    assert iceberg.snapshot_by_id(staged_id).summary[INHERITED_IDS] == "true"
    staged = [m for m in iceberg.snapshot_by_id(staged_id).manifests(iceberg.io) if m.added_snapshot_id == staged_id]
    assert len(staged) == (3 if tiers else 1)  # one manifest per partition spec
    staged_bytes = {m.partition_spec_id: _bytes(m.manifest_path) for m in staged}
    staged_paths = {e.data_file.file_path for m in staged for e in m.fetch_manifest_entry(iceberg.io)}

    known = []
    original = completion.update
    monkeypatch.setattr(completion, "update", lambda *a, **k: known.append(k["known"]) or original(*a, **k))
    publish(rt, job_id)

    iceberg = table.refresh().iceberg
    snapshot = _publish_snapshot(iceberg, job_id)
    added = [m for m in snapshot.manifests(iceberg.io) if m.added_snapshot_id == snapshot.snapshot_id]
    assert {m.partition_spec_id for m in added} == set(staged_bytes)
    for m in added:
        assert m.manifest_path not in {s.manifest_path for s in staged}  # a copy of its own ...
        assert _bytes(m.manifest_path) == staged_bytes[m.partition_spec_id]  # ... byte for byte
        assert m.sequence_number == snapshot.sequence_number
    entries = [e for m in added for e in m.fetch_manifest_entry(iceberg.io)]
    assert {e.data_file.file_path for e in entries} == staged_paths
    assert {e.snapshot_id for e in entries} == {snapshot.snapshot_id}  # inherited from main's manifest list
    assert {e.sequence_number for e in entries} == {snapshot.sequence_number}
    assert snapshot.summary["added-data-files"] == str(len(staged_paths))
    assert snapshot.summary["added-records"] == str(source.num_rows)
    assert snapshot.summary["added-files-size"] == str(sum(e.data_file.file_size_in_bytes for e in entries))
    assert snapshot.summary["changed-partition-count"] == str(len(staged_paths))  # one file per partition here
    assert sort_rows(table.refresh().to_arrow()).num_rows == source.num_rows + 2 * 24 * 2

    # the coverage update read those manifests from what publish held: the same map as decoding them
    [held] = known
    assert set(held) == {m.manifest_path for m in added}
    state = rt.store.get_job(job_id).state
    fresh = coverage.compute(rt, name, state["range_start"], state["range_end"], by="partition").to_dict()
    assert coverage.compute(rt, name, state["range_start"], state["range_end"], by="partition", known=held).to_dict() == fresh
    assert sum(b["writers"].get(job_id, 0) for b in fresh["buckets"]) == source.num_rows  # attributed to the job
    assert {w for b in fresh["buckets"] for w in b["writers"]} <= {job_id, "live"}
    rows = completion.read(rt, name)
    assert rows.num_rows and set(rows.column("last_writer").to_pylist()) >= {job_id}


def test_a_stage_without_inherited_ids_is_published_with_entries_written_anew(lake, sensor, readings, monkeypatch):
    """A job staged by an engine that wrote snapshot ids into its entries (or any staging manifest
    that cannot be listed again) still publishes: the entries are encoded for the publish commit."""
    original = stage_step.append_files
    monkeypatch.setattr(stage_step, "append_files", lambda *a, **k: original(*a, **{**k, "inherit": False}))
    source = readings(recent(30), days=2, devices=2)
    rt = lake.runtime
    job_id = stage_job(lake, source)
    validate(rt, job_id)
    iceberg = sensor.refresh().iceberg
    staged_id = rt.store.get_job(job_id).state["staged_snapshot_id"]
    assert INHERITED_IDS not in iceberg.snapshot_by_id(staged_id).summary.additional_properties
    assert staged_manifests(iceberg, staged_id, []) is None
    publish(rt, job_id)
    iceberg = sensor.refresh().iceberg
    snapshot = _publish_snapshot(iceberg, job_id)
    entries = [e for m in snapshot.manifests(iceberg.io) if m.added_snapshot_id == snapshot.snapshot_id
               for e in m.fetch_manifest_entry(iceberg.io)]
    assert len(entries) == 2 and {e.snapshot_id for e in entries} == {snapshot.snapshot_id}
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(source))


def test_staged_manifests_refuse_a_different_set_of_files(lake, sensor, readings):
    rt = lake.runtime
    job_id = stage_job(lake, readings(recent(30), days=2, devices=2))
    iceberg = sensor.refresh().iceberg
    staged_id = rt.store.get_job(job_id).state["staged_snapshot_id"]
    [manifest] = [m for m in iceberg.snapshot_by_id(staged_id).manifests(iceberg.io) if m.added_snapshot_id == staged_id]
    files = [e.data_file for e in manifest.fetch_manifest_entry(iceberg.io)]
    assert staged_manifests(iceberg, staged_id, files).manifests == [manifest]
    assert staged_manifests(iceberg, staged_id, files[:1]) is None  # one file fewer: not these manifests
    assert staged_manifests(iceberg, staged_id, files + files[:1]) is None


def test_the_private_pyiceberg_parts_a_copy_relies_on():
    """A copy takes its path from the producer (so a failed attempt deletes it with the manifests it
    wrote) and is read back through v2 inheritance; pyiceberg is pinned, this fails if they move."""
    import inspect

    from pyiceberg.manifest import ManifestWriterV2, _inherit_from_manifest
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    assert "_written_manifests.append" in inspect.getsource(_SnapshotProducer.new_manifest_output)
    assert "_written_manifests" in inspect.getsource(_SnapshotProducer._clean_all_uncommitted)
    assert "entry.snapshot_id is None" in inspect.getsource(_inherit_from_manifest)
    assert "entry.snapshot_id is not None" in inspect.getsource(ManifestWriterV2.prepare_entry)


@pytest.mark.parametrize("grain", ["hour", "day"])
def test_partition_buckets_of_a_one_tier_table_are_its_fixed_grain(grain):
    lo = 1_700_006_400_000_000 // 86_400_000_000 * 86_400_000_000
    hi = lo + 10 * 86_400_000_000 + 5 * 3_600_000_000 + 1
    calendar = coverage.bucket_edges(lo, hi, lambda _t: grain, "partition")  # one boundary at a time
    assert coverage.bucket_edges(lo, hi, lambda _t: grain, "partition", grain) == calendar


def test_a_publish_that_loses_a_commit_race_lists_fresh_copies(lake, sensor, readings):
    """A live commit lands between publish's check and its commit: the attempt conflicts, its copies
    are deleted with it, and the retry lists copies of its own on top of the live commit."""
    from timelake.model.faults import at

    rt = lake.runtime
    source = readings(recent(30), days=2, devices=2)
    job_id = stage_job(lake, source)
    validate(rt, job_id)
    live = readings(recent(10), days=1, devices=2, seed=3)
    raced = []

    def race() -> None:
        if not raced:
            raced.append(True)
            sensor.append(live)

    with at("publish.committing", race):
        publish(rt, job_id)
    iceberg = sensor.refresh().iceberg
    snapshot = _publish_snapshot(iceberg, job_id)
    parent = iceberg.snapshot_by_id(snapshot.parent_snapshot_id)
    assert parent.summary.get(JOB_PROPERTY) is None  # built on the live commit
    added = [m for m in snapshot.manifests(iceberg.io) if m.added_snapshot_id == snapshot.snapshot_id]
    copies = {Path(m.manifest_path.removeprefix("file://")) for m in added}
    assert len(copies) == 1 and all(p.exists() for p in copies)
    entries = [e for m in added for e in m.fetch_manifest_entry(iceberg.io)]
    assert {e.snapshot_id for e in entries} == {snapshot.snapshot_id} and len(entries) == 2
    # no copy of the lost attempt is left beside the one main lists
    staged_id = rt.store.get_job(job_id).state["staged_snapshot_id"]
    metadata = next(iter(copies)).parent
    referenced = {Path(m.manifest_path.removeprefix("file://")) for s in iceberg.snapshots() for m in s.manifests(iceberg.io)}
    size = next(iter(copies)).stat().st_size
    strays = [p for p in metadata.glob("*-m*.avro") if p not in referenced and p.stat().st_size == size]
    assert len(strays) <= 1  # at most the staging manifest itself (its snapshot is gone from the metadata)
    assert staged_id not in {s.snapshot_id for s in iceberg.snapshots()}
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(pa.concat_tables([live, source])))
