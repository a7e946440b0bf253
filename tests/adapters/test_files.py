"""Object IO opens a file however an Iceberg writer spelled its location: Java writes local files as
``file:/path``, pyiceberg as ``file:///path``, Spark on S3 as ``s3a://``."""

from __future__ import annotations

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from tests.aws_fixtures import aws, moto_server  # noqa: F401
from timelake.adapters.objects import filesystem
from timelake.ports.files import OBJECT_READS, location_key, reads_at_once


def _read(uri: str, io=None) -> pa.Table:
    fs, path = filesystem(uri, io)
    with fs.open_input_file(path) as handle:
        return pq.read_table(handle)


def test_every_spelling_of_a_local_file_opens_it(tmp_path):
    rows = pa.table({"x": [1, 2, 3]})
    path = tmp_path / "dir with space" / "f.parquet"
    path.parent.mkdir()
    pq.write_table(rows, path)
    spellings = [str(path), f"file:{path}", f"file://{path}", f"file://localhost{path}"]
    for uri in spellings:
        assert _read(uri).equals(rows), uri
        assert _read(uri, PyArrowFileIO()).equals(rows), uri
    assert len({location_key(uri) for uri in spellings}) == 1
    assert location_key(f"file:{path}") != location_key(f"file:{tmp_path / 'other.parquet'}")
    with pytest.raises(ValueError, match="names host 'elsewhere'"):
        filesystem(f"file://elsewhere{path}")


def test_hadoop_s3_schemes_open_the_same_object(aws, monkeypatch):  # noqa: F811
    boto3.client("s3").create_bucket(Bucket="lake")
    rows = pa.table({"x": [1.5, 2.5]})
    fs, path = filesystem("s3://lake/warehouse/data/f.parquet")
    with fs.open_output_stream(path) as out:
        pq.write_table(rows, out)
    for scheme in ("s3", "s3a", "s3n"):
        assert _read(f"{scheme}://lake/warehouse/data/f.parquet").equals(rows), scheme
    # small objects are read many at once from an object store, one at a time from a local disk
    assert reads_at_once(fs) == OBJECT_READS > 1 == reads_at_once(filesystem("/tmp/f.parquet")[0])
    assert location_key("s3a://lake/k") == location_key("s3n://lake/k") == location_key("s3://lake/k")
    # the catalog's FileIO properties reach the object store without the environment's endpoint
    io = PyArrowFileIO({"s3.endpoint": aws, "s3.access-key-id": "testing", "s3.secret-access-key": "testing",
                        "s3.region": "us-east-1"})
    monkeypatch.delenv("TIMELAKE_S3_ENDPOINT")
    assert _read("s3a://lake/warehouse/data/f.parquet", io).equals(rows)
