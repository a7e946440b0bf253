"""Which reader a job's source string names, beyond the files that ``source.open_source`` reads.

Each reader is opened from the job spec alone, so a scan task re-opens it in any process or Lambda.
"""

from __future__ import annotations

from typing import Any

from timelake.model.contract import Contract
from timelake.model.spec import JobSpec
from timelake.sources.base import Source
from timelake.sources.duckdb import DuckDBSource, is_duckdb_uri
from timelake.sources.iceberg import IcebergSource, is_iceberg_uri
from timelake.sources.influx import (ANNOTATED, DIALECTS, InfluxServerSource, is_annotated_csv, is_influx_uri,
                                     is_line_protocol, open_influx_files)
from timelake.sources.postgres import is_postgres, open_for_job


def open_spec_source(spec: JobSpec, table: Any = None, planned: dict | None = None, batch_rows: int = 262_144) -> Source | None:
    """The source of a database, table, query or line-protocol URI; None for the other kinds.
    A database reads its range on the target ``table``'s time column; ``planned`` is what the plan
    pinned of it (its plan_state())."""
    uri = spec.source
    if is_postgres(uri):
        contract = Contract.from_table(table)
        single = contract.tiers[0].transform if len(contract.tiers) == 1 else None
        return open_for_job(spec, contract.time_column, planned, partition=single)
    measurement = spec.measurement or spec.table.rsplit(".", 1)[-1]
    if is_influx_uri(uri):
        return InfluxServerSource(uri, measurement, batch_rows)
    kind = spec.format or ("influx" if is_line_protocol(uri) else ANNOTATED if is_annotated_csv(uri) else None)
    if kind in DIALECTS or kind == ANNOTATED:
        return open_influx_files(uri, measurement, spec.precision, batch_rows, kind, reject=spec.on_bad_value == "reject")
    if is_iceberg_uri(uri):
        return IcebergSource(uri, batch_rows)
    if is_duckdb_uri(uri):
        return DuckDBSource(uri, spec.query, batch_rows)
    return None
