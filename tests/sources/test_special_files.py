"""A FIFO, socket or device among the source files is refused in one line naming it: reading it would
hang, and skipping it would load less than the folder seems to hold."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from timelake.sources.base import SourceError, open_source
from tests.conftest import cli_in_process, recent


def _plant(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    else:
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null


@pytest.mark.parametrize("kind, named", [("fifo", "a FIFO"), ("socket", "a socket"), ("device", "a device")])
@pytest.mark.parametrize("how", ["folder", "glob", "path"])
def test_a_special_file_in_the_source_is_refused_naming_it(tmp_path, readings, kind, named, how):
    folder = tmp_path / "src"
    folder.mkdir()
    pq.write_table(readings(recent(3)), folder / "a.parquet")
    special = folder / "b.parquet"
    _plant(special, kind)
    source = {"folder": str(folder), "glob": f"{folder}/*.parquet", "path": str(special)}[how]
    with pytest.raises(SourceError) as raised:
        open_source(source).pieces()
    assert f"{special} is {named}" in str(raised.value) and "\n" not in str(raised.value)


def test_the_cli_refuses_a_fifo_in_one_line_and_publishes_nothing(tmp_path, sensor, warehouse, readings):
    folder = tmp_path / "src"
    folder.mkdir()
    pq.write_table(readings(recent(3)), folder / "a.parquet")
    os.mkfifo(folder / "pipe.csv")
    code, err = cli_in_process("backfill", "iot.sensor", "--from", str(folder), "--warehouse", str(warehouse))
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(errors) == 1 and f"{folder / 'pipe.csv'} is a FIFO" in errors[0]
    assert sensor.refresh().to_arrow().num_rows == 0


def test_hidden_special_files_stay_skipped_like_other_markers(tmp_path, readings):
    folder = tmp_path / "src"
    folder.mkdir()
    pq.write_table(readings(recent(3)), folder / "a.parquet")
    os.mkfifo(folder / ".lock")
    assert [Path(p).name for p in open_source(str(folder)).pieces()] == ["a.parquet"]
