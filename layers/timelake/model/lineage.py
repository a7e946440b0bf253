"""Where main's rows came from, told by what the table holds now, never by its history.

A shared lake's other engines expire snapshots, compact files and rewrite manifests at any time, so
"which rows were on main when the job was planned, which did live writers add since, which are this
job's own" cannot be read from the chain of snapshots back to the plan: that chain may be gone. What
survives every maintenance operation is in the manifests of main's current snapshot: each data file's
entry keeps the data sequence number of the commit that added its rows (Iceberg v2; a compaction
keeps the sequence number it started from, a manifest rewrite keeps every entry's), and the id of the
snapshot that added it.

So the plan records main's sequence number (`PlanMark`), and a file of main now is:
- ``job``: written by this job (its file names carry the job id: unit files, and the rewrites publish makes);
- ``plan``: its rows were on main at the plan (sequence number at or below the mark);
- ``rewrite``: added since by a ``replace`` snapshot (a compaction or rewrite: rows that were already
  there, in new files), while that snapshot is still in the metadata to say so;
- ``live``: anything else added since: live writers' appends and overwrites, and files whose adding
  snapshot is gone (kept as live: a row is never dropped on a guess).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pyiceberg.manifest import DataFileContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.snapshots import Operation

from timelake.model.iceberg_private import ResidualFreePlanner, with_metadata
from timelake.ports.store import JobState

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask
    from pyiceberg.table import Table as IcebergTable


class Origin(StrEnum):
    JOB = "job"
    PLAN = "plan"
    REWRITE = "rewrite"
    LIVE = "live"


@dataclass(frozen=True)
class PlanMark:
    """Main as the plan found it: its snapshot (for reports only: another engine may expire it) and
    its data sequence number, which the files on main keep however the table is maintained."""

    snapshot_id: int | None
    sequence_number: int

    @classmethod
    def at(cls, table: IcebergTable) -> PlanMark:
        snapshot = table.current_snapshot()
        if snapshot is None:
            return cls(None, 0)
        return cls(snapshot.snapshot_id, snapshot.sequence_number or 0)

    @classmethod
    def of(cls, state: JobState, table: IcebergTable) -> PlanMark:
        """The mark a job's state recorded (a job planned before marks were kept: from its base
        snapshot, while that is still in the metadata)."""
        base = state.get("base_snapshot_id")
        if "base_sequence_number" in state:
            return cls(base, int(state["base_sequence_number"] or 0))
        snapshot = table.snapshot_by_id(base) if base is not None else None
        return cls(base, (snapshot.sequence_number or 0) if snapshot is not None else 0)

    def state(self) -> JobState:
        return {"base_snapshot_id": self.snapshot_id, "base_sequence_number": self.sequence_number}


def is_job_file(path: str, job_id: str) -> bool:
    """Whether ``path`` is a file this job wrote: units write ``<job>-<unit>.parquet``, and publish
    rewrites a file partly inside a replaced range as ``<file>-rest-<job>-<chunk>.parquet``."""
    name = path.rsplit("/", 1)[-1]
    return name.startswith(f"{job_id}-") or f"-rest-{job_id}-" in name


class Lineage:
    """Classifies the entries of main's manifests for one job (see the module's docstring)."""

    def __init__(self, table: IcebergTable, mark: PlanMark, job_id: str) -> None:
        self.table, self.mark, self.job_id = table, mark, job_id
        self.entries: dict[str, ManifestEntry] = {}  # the entries `tasks` planned, by file path
        # a format-v1 table has no sequence numbers: there the snapshots since the plan, while kept, tell
        self._v1_since = None if table.metadata.format_version >= 2 else _since_ids(table, mark.snapshot_id)

    def origin(self, entry: ManifestEntry) -> Origin:
        if is_job_file(entry.data_file.file_path, self.job_id):
            return Origin.JOB
        if self._v1_since is not None:
            if entry.snapshot_id not in self._v1_since:
                return Origin.PLAN
        elif (entry.sequence_number or 0) <= self.mark.sequence_number:
            return Origin.PLAN
        snapshot = self.table.snapshot_by_id(entry.snapshot_id) if entry.snapshot_id is not None else None
        if snapshot is not None and snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE:
            return Origin.REWRITE
        return Origin.LIVE

    def accepts(self, origins: Iterable[Origin | str]) -> Callable[[ManifestEntry], bool]:
        """A filter for `main_tasks`: data files of these origins (delete files always pass: they
        apply to the data files they name)."""
        wanted = {Origin(o) for o in origins}

        def keep(entry: ManifestEntry) -> bool:
            if entry.data_file.content != DataFileContent.DATA:
                return True
            self.entries[entry.data_file.file_path] = entry
            return self.origin(entry) in wanted

        return keep

    def absorbed(self, path: str) -> list[Any] | None:
        """For a file a rewrite added (``rewrite``, planned by `tasks`): the data files of rows other
        writers added since the plan that the rewrite replaced, compacted in with older rows; None
        when that cannot be told (the rewrite's snapshot is gone, or one of those files is, so its
        rows cannot be picked out)."""
        entry = self.entries[path]
        snapshot = self.table.snapshot_by_id(entry.snapshot_id) if entry.snapshot_id is not None else None
        if snapshot is None:
            return None
        io, found = self.table.io, []
        for manifest in snapshot.manifests(io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for replaced in manifest.fetch_manifest_entry(io, discard_deleted=False):
                if replaced.status != ManifestEntryStatus.DELETED or replaced.data_file.content != DataFileContent.DATA:
                    continue
                if (replaced.sequence_number or 0) > self.mark.sequence_number and not is_job_file(
                        replaced.data_file.file_path, self.job_id):
                    found.append(replaced.data_file)
        return found

    def tasks(self, row_filter: Any, origins: Iterable[Origin | str]) -> list[FileScanTask]:
        """Main's current files of ``origins`` that may hold rows matching ``row_filter``, as scan
        tasks (with the delete files that apply to each)."""
        return main_tasks(self.table, row_filter, self.accepts(origins))


def main_tasks(table: IcebergTable, row_filter: Any, keep: Callable[[ManifestEntry], bool] | None = None,
               snapshot_id: int | None = None) -> list[FileScanTask]:
    """The scan tasks of main (or of ``snapshot_id``) for ``row_filter``, of the manifest entries ``keep``
    accepts (None: all): pyiceberg's own planning (partition and column-bound pruning, delete files), with
    an entry filter, since a task no longer carries its entry's sequence number and snapshot."""
    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else table.current_snapshot()
    if snapshot is None:
        return []
    planner = ResidualFreePlanner(table.metadata, table.io, row_filter)
    return list(planner.plan_files(snapshot.manifests(table.io), manifest_entry_filter=keep or (lambda _: True)))


def _since_ids(table: IcebergTable, base: int | None) -> set[int]:
    ids, snapshot = set(), table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != base:
        ids.add(snapshot.snapshot_id)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return ids


def referenced_files(table: IcebergTable) -> set[str]:
    """Every data and delete file that a snapshot still in the table's metadata references (main's
    and every other ref's included): what no cleanup of ours may delete. Reads each manifest once."""
    io = table.io
    seen: set[str] = set()
    paths: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            paths.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=True))
    return paths


def planned_view(table: IcebergTable, state: JobState) -> IcebergTable:
    """The table as the job's plan saw it: the schema and partition spec of then, whatever another
    engine changed since. The job's rows were mapped onto that schema and cut into that spec's
    partitions, so they are written, described and checked in its terms; Iceberg readers project
    them onto the current schema by field id, and each data file keeps its own spec. Only this
    in-memory handle differs: commits made through it send their own changes, never these fields."""
    schema_id, spec_id = state.get("schema_id"), state.get("spec_id")
    metadata = table.metadata
    update: dict[str, Any] = {}
    if schema_id is not None and schema_id != metadata.current_schema_id and any(s.schema_id == schema_id for s in metadata.schemas):
        update["current_schema_id"] = schema_id
    if spec_id is not None and spec_id != metadata.default_spec_id and any(s.spec_id == spec_id for s in metadata.partition_specs):
        update["default_spec_id"] = spec_id
    if not update:
        return table
    return with_metadata(table, **update)
