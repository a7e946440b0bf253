"""The SQL interface: ``CALL timelake_backfill('iot.sensor', 'SELECT ...', mode := 'merge', tz := 'Europe/Berlin')``
in DuckDB; every field of the job JSON is a named parameter.

After ``register(con)``, a backfill is one statement in the caller's DuckDB session. The query runs
on a cursor of the caller's connection, so their attached databases, secrets and settings apply;
that also means only this process can read it, so the job reads its rows here (like any in-memory
source) and fans out only the writing. A job that workers must be able to re-read belongs on the
command line: ``timelake backfill TABLE --from-sql "..."``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from timelake.model.spec import JobSpec

if TYPE_CHECKING:
    import duckdb
    from timelake.interfaces.lake import Lake

FIELDS = tuple(name for name in JobSpec.model_fields if name not in ("table", "source", "query"))


def _macro() -> str:
    """The table macro: every job field a named parameter (``tz := 'Europe/Berlin'``, ``"end" := '2025-01-01'``,
    ``"map" := {'ts': 'timestamp'}``), NULL meaning the job's default, all handed over as one JSON object."""
    params = ", ".join(f'"{name}" := NULL' for name in FIELDS)
    fields = ", ".join(f"'{name}', \"{name}\"" for name in FIELDS)
    return f"""
CREATE OR REPLACE TEMP MACRO timelake_backfill(tbl, q, {params}) AS TABLE
SELECT r->>'job_id' AS job_id, r->>'phase' AS phase, (r->>'rows_in_source')::BIGINT AS rows_in_source,
       (r->>'rows_written')::BIGINT AS rows_written, r AS report
FROM (SELECT timelake_backfill_json(tbl, q, json_object({fields})::VARCHAR)::JSON AS r)
"""


def register(con: duckdb.DuckDBPyConnection, lake: Lake | None = None) -> None:
    """Define ``timelake_backfill`` on ``con``; jobs go to ``lake`` (default: ``timelake.connect()``, or
    ``timelake.connect(catalog=NAME)`` for a call with ``catalog := 'NAME'``).

    DuckDB has no Python table functions, so a side-effecting scalar function does the work and a
    table macro turns its JSON report into a row; the report is the job's, failures raise.
    """

    def backfill(table: str, query: str, options: str) -> str:
        from timelake.interfaces.lake import connect

        fields = {name: value for name, value in json.loads(options).items() if value is not None}
        target = lake or connect(catalog=fields.get("catalog"))
        spec = JobSpec(table=table, source=f"<duckdb query {' '.join(query.split())[:200]}>", query=query, **fields)
        with con.cursor() as cursor:
            rows = cursor.sql(query).to_arrow_table()  # every step re-opens the source: a reader reads once
        return json.dumps(target.submit(spec, rows, wait=True).wait().report(), default=str)

    con.create_function("timelake_backfill_json", backfill, ["VARCHAR", "VARCHAR", "VARCHAR"], "VARCHAR", side_effects=True)
    con.execute(_macro())
