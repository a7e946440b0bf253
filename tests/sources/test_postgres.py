"""PostgreSQL / TimescaleDB as a source, against a real server started by the tests."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from tests.conftest import SCHEMA, reference_merge, sort_rows
from tests.sources.conftest import PgServer


def _source_rows(postgres: PgServer, table: str = "readings", where: str = "true") -> pa.Table:
    return postgres.sql(f"SELECT ts, device_id, value FROM {table} WHERE {where}").cast(SCHEMA)


def test_smoke(postgres, readings_table, sensor):
    job = sensor.backfill(source=postgres.uri(table=readings_table)).wait()
    report = job.report()
    print(report["source_limits"], report["rows_written"], report["units"])
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(_source_rows(postgres)))
