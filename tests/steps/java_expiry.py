"""Java's snapshot expiry, as other engines run it on our tables, re-implemented over the metadata: a
fast unit check of the metadata a job leaves behind. The real thing, Iceberg's Java code through Spark,
runs in tests/lake/.

`IncrementalFileCleanup.cleanFiles` (apache/iceberg, core; used by ExpireSnapshots when the table
has one ref, as after a backfill): for every expired snapshot that is neither an ancestor of main
nor cherry-picked into it (``source-snapshot-id`` in an ancestor's summary), it deletes every
ADDED file of the manifests that snapshot wrote (``manifestsToRevert``); for an expired ancestor it
deletes the files its manifests mark DELETED by a snapshot that is no longer valid
(``manifestsToScan``). Manifests still listed by a surviving snapshot are left alone.
"""

from __future__ import annotations

from pathlib import Path

from pyiceberg.manifest import ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot


def files_deleted_by_expiring_all_but_current(table: Table) -> set[str]:
    """The data files Java's ExpireSnapshots would delete if every snapshot but main's current one expired."""
    io, current = table.io, table.current_snapshot()
    valid = {current.snapshot_id} if current is not None else set()
    expired = {s.snapshot_id for s in table.snapshots()} - valid
    ancestors, snapshot = set(), current
    while snapshot is not None:
        ancestors.add(snapshot.snapshot_id)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    picked = {_source(s) for s in table.snapshots() if s.snapshot_id in ancestors} - {-1}
    valid_manifests, to_scan, to_revert = set(), {}, {}
    for sid in valid:
        for m in table.snapshot_by_id(sid).manifests(io):
            valid_manifests.add(m.manifest_path)
            if m.added_snapshot_id not in valid and (m.added_snapshot_id in ancestors | picked) and _has_deleted(m):
                to_scan[m.manifest_path] = m
    for snapshot in table.snapshots():
        if snapshot.snapshot_id in valid or snapshot.snapshot_id in picked:
            continue
        source = _source(snapshot)
        if source in ancestors or source in picked:
            continue
        for m in snapshot.manifests(io):
            if m.manifest_path in valid_manifests:
                continue
            from_ancestor = m.added_snapshot_id in ancestors
            if from_ancestor and _has_deleted(m):
                to_scan[m.manifest_path] = m
            if not from_ancestor and m.added_snapshot_id in expired and m.has_added_files():
                to_revert[m.manifest_path] = m
    deleted = set()
    for m in to_scan.values():
        deleted |= {e.data_file.file_path for e in m.fetch_manifest_entry(io, discard_deleted=False)
                    if e.status == ManifestEntryStatus.DELETED and e.snapshot_id not in valid}
    for m in to_revert.values():
        deleted |= {e.data_file.file_path for e in m.fetch_manifest_entry(io, discard_deleted=False)
                    if e.status == ManifestEntryStatus.ADDED}
    return deleted


def _source(snapshot: Snapshot) -> int:
    """The snapshot a cherry-pick copied (Java's ``source-snapshot-id``), or -1."""
    value = (snapshot.summary or {}).get("source-snapshot-id")
    return -1 if value is None else int(value)


def _has_deleted(manifest: ManifestFile) -> bool:
    return manifest.deleted_files_count is None or manifest.deleted_files_count > 0


def live_files(table: Table) -> set[str]:
    current = table.current_snapshot()
    return set() if current is None else {
        e.data_file.file_path for m in current.manifests(table.io) for e in m.fetch_manifest_entry(table.io)}


def dangling_snapshots(table: Table) -> list[int]:
    """Snapshots in the metadata that reference a data file that no longer exists (time travel fails)."""
    return [s.snapshot_id for s in table.snapshots()
            if any(not Path(e.data_file.file_path.removeprefix("file://")).exists()
                   for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io))]


def assert_safe_for_other_engines(table: Table) -> None:
    """Expiring every snapshot but the current one deletes no live file, and no snapshot dangles."""
    table = table.refresh()
    assert not files_deleted_by_expiring_all_but_current(table) & live_files(table)
    assert dangling_snapshots(table) == []
