"""Reading sources: every format, listing rules, batch slicing and fingerprints, on real files."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import timelake.sources.base as source_module
from timelake.sources.base import MEMORY, SourceError, open_source

ROWS = 10


def _table(rows: int = ROWS) -> pa.Table:
    return pa.table({"ts": [f"2024-01-01T00:00:{i % 60:02d}Z" for i in range(rows)], "v": list(range(rows))})


def _csv_text(rows: int = ROWS) -> str:
    return "ts,sensor,v\n" + "".join(f"2024-01-01 00:00:{i % 60:02d},s{i % 3},{i}\n" for i in range(rows))


def _jsonl_text(rows: int = ROWS) -> str:
    return "".join(json.dumps({"ts": f"2024-01-01T00:00:{i % 60:02d}+01:00", "v": i}) + "\n" for i in range(rows))


def _all_rows(source, piece=None) -> pa.Table:
    return pa.Table.from_batches([b.data for b in source.batches(piece)])


def test_parquet_batches_are_sliced_with_offsets(tmp_path: Path) -> None:
    pq.write_table(_table(25), tmp_path / "a.parquet")
    source = open_source(str(tmp_path / "a.parquet"), batch_rows=10)
    batches = list(source.batches())
    assert [(b.data.num_rows, b.row_offset) for b in batches] == [(10, 0), (10, 10), (5, 20)]
    assert {b.origin for b in batches} == {str(tmp_path / "a.parquet")}
    assert batches[2].data.column("v").to_pylist() == [20, 21, 22, 23, 24]
    assert source.schema() == _table().schema


def test_parquet_read_beside_other_scans_decodes_on_the_callers_thread_alike(tmp_path: Path) -> None:
    """A scan of a fan-out decodes on its own thread (`Source.share_cores`): same batches, offsets and
    dictionaries as a read on Arrow's threads."""
    rows = pa.table({"ts": list(range(3000)), "sensor": [f"s{i % 7}" for i in range(3000)], "v": [i / 3 for i in range(3000)]})
    pq.write_table(rows, tmp_path / "a.parquet", row_group_size=1000)
    read = []
    for shared in (False, True):
        source = open_source(str(tmp_path / "a.parquet"), batch_rows=1200)
        source.read_dictionaries({"sensor"})
        if shared:
            source.share_cores()
        read.append([(b.row_offset, b.data) for b in source.read(source.pieces())])
    assert [offset for offset, _ in read[1]] == [0, 1200, 2400]
    assert [(o, d.to_pydict(), d.schema) for o, d in read[0]] == [(o, d.to_pydict(), d.schema) for o, d in read[1]]
    assert pa.types.is_dictionary(read[1][0][1].schema.field("sensor").type)


def test_parquet_files_without_a_wanted_dictionary_column_read_the_ones_they_have(tmp_path: Path) -> None:
    """A scan asks every file for the same dictionary columns; a file that lacks one (an older export
    without the column) is read with those it has, the others as before."""
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"ts": [1, 2], "sensor": ["a", "b"], "site": ["x", "x"]}), tmp_path / "d" / "a.parquet")
    pq.write_table(pa.table({"ts": [3], "sensor": ["c"]}), tmp_path / "d" / "b.parquet")
    source = open_source(str(tmp_path / "d"))
    source.read_dictionaries({"sensor", "site"})
    first, second = [b.data for b in source.read(source.pieces())]
    assert [pa.types.is_dictionary(first.schema.field(n).type) for n in ("ts", "sensor", "site")] == [False, True, True]
    assert [pa.types.is_dictionary(second.schema.field(n).type) for n in ("ts", "sensor")] == [False, True]
    assert (first.column("site").to_pylist(), second.column("sensor").to_pylist()) == (["x", "x"], ["c"])


def test_csv_reads_every_column_as_text(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(_csv_text(25) + "2024-01-01 00:01:00,,\n")
    source = open_source(str(tmp_path / "a.csv"), batch_rows=10)
    assert source.schema() == pa.schema([("ts", pa.string()), ("sensor", pa.string()), ("v", pa.string())])
    batches = list(source.batches())
    assert [(b.data.num_rows, b.row_offset) for b in batches] == [(10, 0), (10, 10), (6, 20)]
    last = batches[-1].data
    assert last.column("v").to_pylist()[-2:] == ["24", None]
    assert last.column("sensor").to_pylist()[-1] is None


def test_gzipped_csv(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.csv.gz", "wt") as f:
        f.write(_csv_text())
    source = open_source(str(tmp_path / "a.csv.gz"), batch_rows=4)
    assert [b.row_offset for b in source.batches()] == [0, 4, 8]
    assert _all_rows(source).column("v").to_pylist() == [str(i) for i in range(ROWS)]


def test_csv_with_header_only_or_no_bytes_has_no_rows(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("ts,v\n")
    (tmp_path / "b.csv").write_text("")
    assert list(open_source(str(tmp_path / "*.csv")).batches()) == []


def test_jsonl_keeps_date_text_and_tolerates_sparse_fields(tmp_path: Path) -> None:
    lines = _jsonl_text(12) + json.dumps({"ts": "2024-01-01T00:01:00Z", "v": 12, "note": "late field"}) + "\n"
    (tmp_path / "a.jsonl").write_text(lines)
    source = open_source(str(tmp_path / "a.jsonl"), batch_rows=5)
    assert source.schema().field("ts").type == pa.string()
    batches = list(source.batches())
    assert [b.row_offset for b in batches] == [0, 5, 10]
    assert batches[0].data.column("ts")[0].as_py() == "2024-01-01T00:00:00+01:00"
    assert batches[-1].data.column("note").to_pylist() == [None, None, "late field"]


def test_gzipped_ndjson(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.ndjson.gz", "wt") as f:
        f.write(_jsonl_text())
    assert _all_rows(open_source(str(tmp_path / "a.ndjson.gz"))).column("v").to_pylist() == list(range(ROWS))


def test_glob_matches_one_level_and_sorts(tmp_path: Path) -> None:
    for name in ["b.parquet", "a.parquet", "sub/c.parquet"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(_table(), tmp_path / name)
    source = open_source(str(tmp_path / "*.parquet"))
    assert source.pieces() == [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert source.uri == str(tmp_path / "*.parquet")
    assert [b.origin for b in source.batches()] == source.pieces()


def test_recursive_glob_and_single_piece(tmp_path: Path) -> None:
    for name in ["a.csv", "x/b.csv", "x/y/c.csv", "x/y/d.parquet"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(_csv_text())
    source = open_source(str(tmp_path / "**" / "*.csv"))
    assert source.pieces() == [str(tmp_path / n) for n in ["a.csv", "x/b.csv", "x/y/c.csv"]]
    only = source.pieces()[1]
    assert {b.origin for b in source.batches(only)} == {only}
    with pytest.raises(SourceError, match="not a piece"):
        list(source.batches(str(tmp_path / "nope.csv")))


def test_directory_lists_known_files_and_skips_markers(tmp_path: Path) -> None:
    (tmp_path / "part").mkdir()
    pq.write_table(_table(), tmp_path / "part" / "a.parquet")
    (tmp_path / "b.jsonl").write_text(_jsonl_text())
    for marker in ["_SUCCESS", ".a.parquet.crc", "README.md"]:
        (tmp_path / marker).write_text("x")
    source = open_source(str(tmp_path))
    assert source.pieces() == [str(tmp_path / "b.jsonl"), str(tmp_path / "part" / "a.parquet")]
    assert sum(b.data.num_rows for b in source.batches()) == 2 * ROWS


def test_file_uri(tmp_path: Path) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    source = open_source(f"file://{tmp_path}/*.parquet")
    assert source.pieces() == [f"file://{tmp_path}/a.parquet"]
    assert _all_rows(source).num_rows == ROWS


def test_relative_glob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "a.csv").write_text(_csv_text())
    monkeypatch.chdir(tmp_path)
    assert open_source("exports/*.csv").pieces() == [str(tmp_path / "exports" / "a.csv")]


def test_no_match(tmp_path: Path) -> None:
    pattern = str(tmp_path / "missing" / "*.parquet")
    with pytest.raises(SourceError, match=re.escape(f"no source files match '{pattern}'")):
        open_source(pattern)
    with pytest.raises(SourceError, match="no source files match"):
        open_source(str(tmp_path / "nope.csv"))


def test_unknown_extension_names_file_and_known_extensions(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(_csv_text())
    with pytest.raises(SourceError, match=r"a\.txt.*\.parquet.*\.csv\.gz"):
        open_source(str(tmp_path / "*"))
    assert _all_rows(open_source(str(tmp_path / "a.txt"), format="csv")).num_rows == ROWS
    with pytest.raises(SourceError, match="unknown source format 'xml'"):
        open_source(str(tmp_path / "a.txt"), format="xml")


def test_corrupt_parquet_names_file(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    source = open_source(str(path))
    with pytest.raises(SourceError, match=re.escape(f"{path} is not a readable Parquet file")):
        list(source.batches())
    with pytest.raises(SourceError, match="x.parquet"):
        source.schema()


def test_malformed_json_names_file(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n{"v": \n')
    with pytest.raises(SourceError, match="a.jsonl is not a readable newline-delimited JSON file"):
        list(open_source(str(tmp_path / "a.jsonl")).batches())


def test_pandas_dataframe_keeps_named_index() -> None:
    frame = pd.DataFrame(
        {"v": range(5)}, index=pd.date_range("2024-01-01", periods=5, freq="h", tz="UTC", name="ts")
    )
    source = open_source(frame, batch_rows=2)
    assert source.pieces() == [MEMORY]
    assert source.uri == "<pandas.DataFrame 5 rows>"
    batches = list(source.batches())
    assert [(b.row_offset, b.origin) for b in batches] == [(0, MEMORY), (2, MEMORY), (4, MEMORY)]
    assert set(source.schema().names) == {"v", "ts"}


def test_pyarrow_table() -> None:
    table = pa.Table.from_batches(_table(7).to_batches(max_chunksize=3))
    source = open_source(table, batch_rows=5)
    assert source.uri == "<pyarrow.Table 7 rows>"
    assert [b.data.num_rows for b in source.batches()] == [5, 2]
    assert _all_rows(source).equals(table)
    assert list(source.batches(MEMORY))[1].row_offset == 5


def test_record_batch_reader_is_drained_once_and_rereadable() -> None:
    table = _table(6)
    source = open_source(pa.RecordBatchReader.from_batches(table.schema, table.to_batches()), batch_rows=4)
    assert source.schema() == table.schema
    first = source.fingerprint()
    assert _all_rows(source).equals(table)
    assert _all_rows(source).equals(table)
    assert source.fingerprint() == first


def test_memory_fingerprint_follows_schema_and_rows() -> None:
    assert open_source(_table(5)).fingerprint() == open_source(_table(5)).fingerprint()
    assert open_source(_table(5)).fingerprint() != open_source(_table(6)).fingerprint()


def test_file_fingerprint_is_stable_and_tracks_changes(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(_csv_text())
    (tmp_path / "b.csv").write_text(_csv_text())
    source = open_source(str(tmp_path / "*.csv"))
    first = source.fingerprint()
    assert len(first) == 64 and first == source.fingerprint() == open_source(str(tmp_path / "*.csv")).fingerprint()
    (tmp_path / "b.csv").write_text(_csv_text(ROWS + 1))
    assert source.fingerprint() != first
    stat = (tmp_path / "b.csv").stat()
    second = source.fingerprint()
    os.utime(tmp_path / "b.csv", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert source.fingerprint() != second
    (tmp_path / "b.csv").unlink()
    with pytest.raises(SourceError, match="b.csv no longer exists"):
        source.fingerprint()


def test_empty_source_is_not_an_error(tmp_path: Path) -> None:
    pq.write_table(_table(0), tmp_path / "a.parquet")
    assert list(open_source(str(tmp_path / "a.parquet")).batches()) == []
    assert list(open_source(_table(0)).batches()) == []


def test_jsonl_chunks_may_differ_in_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_module, "_JSON_CHUNK_BYTES", 100)
    rows = [{"ts": "2024-01-01T00:00:00Z", "v": None}] * 6 + [{"ts": "2024-01-01 00:00:00", "v": 1.5}] * 6
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    batches = list(open_source(str(tmp_path / "a.jsonl"), batch_rows=1000).batches())
    assert len(batches) > 1 and batches[0].data.schema.field("v").type == pa.null()
    assert [b.row_offset for b in batches] == [0, *itertools.accumulate(b.data.num_rows for b in batches[:-1])]
    assert pa.concat_arrays([b.data.column("v").cast(pa.float64()) for b in batches]).to_pylist()[-1] == 1.5
    assert {b.data.schema.field("ts").type for b in batches} == {pa.string()}
