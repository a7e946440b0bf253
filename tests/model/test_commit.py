"""Guards on the private pyiceberg API that multi-spec appends build on (pinned pyiceberg)."""

from __future__ import annotations

import inspect

import pyiceberg
from pyiceberg.table.update.snapshot import _FastAppendFiles, _SnapshotProducer

from timelake.model.commit import _MultiSpecAppend, is_conflict


def test_pinned_pyiceberg_shape_we_override():
    assert pyiceberg.__version__ == "0.12.0"
    for name in ("_manifests", "_summary", "_existing_manifests", "new_manifest_writer", "spec", "append_data_file"):
        assert hasattr(_FastAppendFiles, name), name
    assert list(inspect.signature(_SnapshotProducer.__init__).parameters)[:6] == [
        "self", "operation", "transaction", "io", "commit_uuid", "snapshot_properties"]
    assert "_added_data_files" in inspect.getsource(_SnapshotProducer.__init__)
    assert issubclass(_MultiSpecAppend, _FastAppendFiles)


def test_sequence_number_race_counts_as_conflict():
    assert is_conflict(ValueError("Cannot add snapshot with sequence number 5 older than last sequence number 5"))
    assert not is_conflict(ValueError("something else"))
