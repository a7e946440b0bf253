"""Readers of what a backfill loads: files (Parquet, CSV, JSON), PostgreSQL/TimescaleDB, InfluxDB
(server and line-protocol exports), Iceberg tables and DuckDB queries, behind one `Source`
interface; the mapping onto the table contract; the job-wide throttle.
"""
