"""The job definition: one pydantic model for the CLI, the Python API, the state machine and the API.

It is the whole input of a job, so a job JSON replayed anywhere (laptop or AWS) means the same job.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import date, datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from timelake.model.timeutil import parse_instant

Mode = Literal["merge", "replace", "append"]
PublishBy = Literal["day", "week", "month"]
DstPolicy = Literal["refuse", "earliest", "latest", "drop"]
TimeUnit = Literal["s", "ms", "us", "ns"]
_URI_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@?#]*:[^/@?#]*@")


def new_job_id() -> str:
    """Sortable, readable and valid as a Step Functions execution name and an Iceberg branch suffix."""
    return f"bf-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class JobSpec(BaseModel):
    """A backfill job. ``map`` is table column → source column (``{"ts": "timestamp"}``)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(
        default_factory=new_job_id, pattern=r"^[0-9A-Za-z_-]{1,80}$",
        description="The job's id: letters, digits, _ and -, up to 80 (default: bf-<UTC date>-<UTC time>-<6 hex "
        "digits>); on AWS it is the execution name")
    table: str = Field(description="Target table, namespace.name")
    source: str = Field(description="Path, glob or URI of the source (files, postgresql://, influxdb://, iceberg://, "
                        "duckdb:); '<memory ...>' for in-process data")
    format: Literal["parquet", "csv", "json", "influx"] | None = Field(
        default=None, description="Source file format; influx is InfluxDB line protocol (default: from the extension)")
    map: dict[str, str] = Field(default_factory=dict, description="Table column -> source column, for columns "
                                "whose names differ")
    tz: str | None = Field(default=None, description="IANA zone of naive source timestamps (and of naive start/end)")
    time_unit: TimeUnit | None = Field(default=None, description="Unit of integer epoch timestamps")
    dst_policy: DstPolicy = Field(
        default="refuse", description="Naive local times that a DST change makes ambiguous or missing: refuse the "
        "job, take the earliest or latest instant, or drop the row")
    mode: Mode = Field(default="merge", description="How the job meets rows already on main: merge (existing rows "
                       "win), replace (the job's range is replaced) or append (no deduplication)")
    start: datetime | None = Field(default=None, description="Inclusive lower bound of the job range (ISO)")
    end: datetime | None = Field(default=None, description="Exclusive upper bound of the job range (ISO)")
    dry_run: bool = Field(default=False, description="Report only; change nothing")
    publish_by: PublishBy | None = Field(default=None, description="One publish commit per day, week or month "
                                         "instead of one for the whole job")
    max_concurrency: int | None = Field(
        default=None, ge=1, le=10_000,
        description="Parallel scan tasks and writers (default: the CPU count; on AWS the Map's MaxConcurrency)")
    assertions: list[str] = Field(default_factory=list, description="SQL over the view staged returning the "
                                  "failing rows; any row fails the job")
    override_retention: bool = Field(default=False, description="Keep rows older than the table's retention "
                                     "instead of dropping them")
    evaluate_rules: bool = Field(default=False, description="After publish, evaluate the table's rules over the "
                                 "published range into its events table (source 'backfill'); never alarms")
    canary: bool | date | None = Field(
        default=None, description="Write and validate one UTC day first, then wait for approval: a day (YYYY-MM-DD), "
        "or true (a bare --canary) for the first day with source rows")
    approval_timeout_seconds: int = Field(
        default=7 * 24 * 3600, ge=1, le=365 * 24 * 3600,
        description="Seconds a canary waits for approve or reject before the job is aborted (on AWS by the "
        "workflow; embedded, an approval after it aborts the job)")
    query: str | None = Field(default=None, description="SQL text for database sources: a SELECT for PostgreSQL "
                              "(instead of ?table=), the query of a 'duckdb:' source (--from-sql)")
    source_max_connections: int | None = Field(
        default=None, ge=1, le=10_000, description="Scan tasks reading the source at once (database default: 2)")
    source_rows_per_second: int | None = Field(
        default=None, ge=0,
        description="Rows per second read from the source by all workers together; 0: no limit (database default: 250000)")
    measurement: str | None = Field(default=None, description="InfluxDB measurement to read (default: the table's name)")
    precision: TimeUnit | None = Field(default=None, description="Timestamp unit of line-protocol files (default ns)")

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, tz: str | None) -> str | None:
        if tz is not None:
            from zoneinfo import ZoneInfo

            try:
                ZoneInfo(tz)
            except Exception as exc:
                raise ValueError(f"unknown time zone '{tz}' (use an IANA name such as Europe/Berlin)") from exc
        return tz

    @field_validator("source")
    @classmethod
    def _no_password(cls, source: str) -> str:
        """The job JSON is stored and shown: a password in a URI would end up in both."""
        if _URI_PASSWORD.match(source):
            raise ValueError("the source URI holds a password; pass it through PGPASSWORD, password_env=VAR or secret=ARN")
        return source

    @field_validator("table")
    @classmethod
    def _qualified(cls, table: str) -> str:
        if "." not in table:
            raise ValueError(f"table '{table}' must be namespace.name, e.g. iot.sensor")
        return table

    @model_validator(mode="before")
    @classmethod
    def _bounds_in_tz(cls, data: dict) -> dict:
        if isinstance(data, dict):
            for key in ("start", "end"):
                if isinstance(data.get(key), str | datetime):
                    data[key] = parse_instant(data[key], data.get("tz"))
        return data

    @model_validator(mode="after")
    def _ordered(self) -> "JobSpec":
        if self.start and self.end and self.start >= self.end:
            raise ValueError(f"start {self.start.isoformat()} must be before end {self.end.isoformat()}")
        # in-memory data ("<...>") may keep the query that produced it, as a record of the job
        if self.query is not None and not self.source.startswith(("postgresql://", "postgres://", "duckdb:", "<")):
            raise ValueError("query applies to a PostgreSQL source (postgresql://...) or a DuckDB one (--from-sql) only")
        return self

    def to_json(self) -> dict:
        return json.loads(self.model_dump_json())
