"""The public name of the DuckDB `CALL timelake_backfill(...)`: ``timelake.duckdb.register(con)``."""

from timelake.interfaces.sql import register

__all__ = ["register"]
