"""The job definition: one pydantic model for the CLI, the Python API, the state machine and the API.

It is the whole input of a job, so a job JSON replayed anywhere (laptop or AWS) means the same job.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, create_model, field_validator, model_validator

from timelake.errors import DocumentError
from timelake.model.timeutil import parse_instant
from timelake.model.window import Window, window_of

if TYPE_CHECKING:
    from timelake.ports.store import JobRecord, JobState

Mode = Literal["merge", "replace", "append"]
PublishBy = Literal["day", "week", "month"]
DstPolicy = Literal["refuse", "earliest", "latest", "drop", "infer"]
BadValue = Literal["fail", "null", "reject"]
DEFAULT_NULL_VALUES = ["", "NA", "N/A", "n/a", "null", "NULL", "NaN", "#N/A"]
TimeUnit = Literal["s", "ms", "us", "ns"]
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PASSWORD_PARAMS = {"password", "passwd", "pwd", "pass", "sslpassword"}
PASSWORD_WAYS = "pass it through PGPASSWORD, password_env=VAR or secret=ARN"
MAX_ASSERTIONS, MAX_ASSERTION_CHARS = 100, 64 * 1024
MAX_DOCUMENT_BYTES, MAX_NESTING = 1024 * 1024, 32
MAX_REASON_CHARS = 2000
FIRST_YEAR, LAST_YEAR = 1, 9998
MAX_CONCURRENCY = 10_000
#: UTC microseconds of 9999-01-01: the first instant past the last year a job may cover
LAST_MICROS = 253_370_764_800_000_000


def new_job_id() -> str:
    """Sortable, readable and valid as a Step Functions execution name and an Iceberg branch suffix."""
    return f"bf-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class JobSpec(BaseModel):
    """A backfill job. ``map`` is table column → source column (``{"ts": "timestamp"}``)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(
        default_factory=new_job_id, pattern=r"^[0-9A-Za-z_-]{1,80}$",
        description="The job's id: letters, digits, _ and -, up to 80 (default: bf-<UTC date>-<UTC time>-<6 hex "
        "digits>); on AWS it is the execution name")
    table: str = Field(pattern=r"^[^.\s]+(\.[^.\s]+)+$", max_length=255, description="Target table, namespace.name")
    catalog: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$",
        description="The pyiceberg catalog holding the table, by its name in .pyiceberg.yaml or "
        "PYICEBERG_CATALOG__<NAME>__* variables (default: the embedded lake; on AWS, the stack's catalog)")
    source: str = Field(min_length=1, description="Path, glob or URI of the source (files, postgresql://, influxdb://, iceberg://, "
                        "duckdb:); '<memory ...>' for in-process data")
    format: Literal["parquet", "csv", "json", "influx", "influx2", "influx-csv"] | None = Field(
        default=None, description="Source file format; influx is InfluxDB 1.x line protocol (influx_inspect export), "
        "influx2 InfluxDB 2.x line protocol (influxd inspect export-lp), influx-csv the annotated CSV of "
        "influx query --raw (default: from the extension)")
    map: dict[str, str] = Field(default_factory=dict, description="Table column -> source column, for columns "
                                "whose names differ")
    tz: str | None = Field(default=None, description="IANA zone of naive source timestamps (and of naive start/end)")
    time_unit: TimeUnit | None = Field(default=None, description="Unit of integer epoch timestamps")
    dst_policy: DstPolicy = Field(
        default="infer", description="Naive local times that a DST change makes ambiguous or missing: infer the "
        "instant from each series' source order (the first pass through a repeated hour is the earlier instant; fails "
        "where the order cannot tell), refuse the job, take the earliest or latest instant (rows folded together count "
        "as dst_collapsed), or drop the row")
    null_values: list[Annotated[str, Field(max_length=100)]] = Field(
        default_factory=lambda: list(DEFAULT_NULL_VALUES), max_length=100,
        description="Text cells that mean no value (default: empty, NA, N/A, n/a, null, NULL, NaN, #N/A)")
    on_bad_value: BadValue = Field(
        default="fail", description="A value that cannot be converted: fail the job naming it, store null instead, "
        "or reject the row; nulled values and rejected rows are counted per column and kind, with examples")
    max_rejected: StrictInt | Annotated[str, Field(pattern=r"^\d+(\.\d+)?%$")] | None = Field(
        default=None, description="Rows the job may reject or null (bad values, rows without a time or series "
        "key) before it fails validation, unpublished: a count or a percentage of the source rows, e.g. 100 or "
        "'0.5%' (default: 0.1% with --on-bad-value null or reject, else 0)")
    states_column: str | None = Field(
        default=None, min_length=1, max_length=255, description="A text column of the table that keeps the text "
        "of values of a numeric column that are no numbers (digital states such as 'I/O Timeout'; the value is "
        "then null), counted per state")
    delimiter: str = Field(default=",", min_length=1, max_length=1, description="CSV field delimiter (e.g. ';')")
    decimal: Literal[".", ","] = Field(default=".", description="Decimal mark of numbers in CSV/text sources "
                                      "(',' for a decimal comma)")
    thousands: Literal[",", ".", " ", "'", "_"] | None = Field(
        default=None, description="Thousands separator of numbers in CSV/text sources, e.g. ',' for 1,234.5 "
        "(only numbers grouped in threes by it are read so)")
    wide: StrictBool = Field(
        default=False, description="The source is wide, one column per series (Ignition, WideHistory, Excel): "
        "every column but the time and the id columns becomes rows, its name the series key and its cells the "
        "value; blank cells are skipped")
    id_columns: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(
        default_factory=list, max_length=100, description="Wide source: columns that are not series but kept on "
        "every row (e.g. a batch or quality column), mapped like any other")
    key_separator: str | None = Field(
        default=None, min_length=1, max_length=10, description="Wide source: split each column name at this "
        "text into the table's series key columns, e.g. '/' turns 'Plant1/TI-101' into two keys")
    timestamp_format: str | None = Field(
        default=None, max_length=200, description="strptime format of text timestamps, e.g. '%d.%m.%Y %H:%M:%S' "
        "(default: ISO 8601, or DD.MM.YYYY HH:MM[:SS])")
    skip_rows: StrictInt = Field(default=0, ge=0, le=1_000_000, description="CSV lines to skip before the header")
    skip_after_header: StrictInt = Field(default=0, ge=0, le=1_000_000,
                                         description="CSV lines to skip after the header (a units line)")
    encoding: str = Field(default="utf-8", min_length=1, max_length=40,
                          description="Text encoding of CSV files (e.g. latin-1, cp1252)")
    mode: Mode = Field(default="merge", description="How the job meets rows already on main: merge (existing rows "
                       "win), replace (the job's range is replaced) or append (no deduplication)")
    start: datetime | None = Field(default=None, description="Inclusive lower bound of the job range (ISO)")
    end: datetime | None = Field(default=None, description="Exclusive upper bound of the job range (ISO)")
    dry_run: StrictBool = Field(default=False, description="Report only; change nothing")
    publish_by: PublishBy | None = Field(default=None, description="One publish commit per day, week or month "
                                         "instead of one for the whole job")
    max_concurrency: StrictInt | None = Field(
        default=None, ge=1, le=MAX_CONCURRENCY,
        description="Parallel scan tasks and writers (default: the CPU count; on AWS the Map's MaxConcurrency); "
        "`timelake backfill set` changes it on a running job")
    run_between: str | None = Field(
        default=None, max_length=20, description="Quiet hours: the job works only between these local times each "
        "day, e.g. '22:00-06:00' (an end before the start spans midnight). When the window closes, running units "
        "finish and no new one starts until it opens again; publish waits for it too. Planning runs at once")
    run_tz: str | None = Field(default=None, description="IANA zone of run_between (default: tz, else UTC)")
    assertions: list[Annotated[str, Field(max_length=MAX_ASSERTION_CHARS)]] = Field(
        default_factory=list, max_length=MAX_ASSERTIONS,
        description="SQL over the view staged returning the failing rows; any row fails the job (at most 100, of "
        "at most 64 KiB each)")
    assertion_timeout: StrictInt = Field(
        default=300, ge=1, le=24 * 3600,
        description="Seconds all assertions together may run; past it the job fails validation and releases its lease")
    override_retention: StrictBool = Field(default=False, description="Keep rows older than the table's retention "
                                     "instead of dropping them")
    evaluate_rules: StrictBool = Field(default=False, description="After publish, evaluate the table's rules over the "
                                 "published range into its events table (source 'backfill'); never alarms")
    canary: StrictBool | date | None = Field(
        default=None, description="Write and validate one UTC day first, then wait for approval: a day (YYYY-MM-DD), "
        "or true (a bare --canary) for the first day with source rows")
    approval_timeout_seconds: StrictInt = Field(
        default=7 * 24 * 3600, ge=1, le=365 * 24 * 3600,
        description="Seconds a canary waits for approve or reject before the job is aborted (on AWS by the "
        "workflow; embedded, an approval after it aborts the job)")
    query: str | None = Field(default=None, description="SQL text for database sources: a SELECT for PostgreSQL "
                              "(instead of ?table=), the query of a 'duckdb:' source (--from-sql)")
    source_max_connections: StrictInt | None = Field(
        default=None, ge=1, le=10_000, description="Scan tasks reading the source at once (database default: 2)")
    source_rows_per_second: StrictInt | None = Field(
        default=None, ge=0,
        description="Rows per second read from the source by all workers together; 0: no limit (database default: "
        "250000); `timelake backfill set` changes it on a running job")
    measurement: str | None = Field(default=None, description="InfluxDB measurement to read (default: the table's name)")
    reason: str | None = Field(
        default=None, max_length=MAX_REASON_CHARS,
        description="Why the job runs, e.g. the definition it loads under ('calibration v2: offset fixed'); kept in "
        "timelake.backfills and in the publish snapshots' summary")
    diff: StrictBool = Field(
        default=True, description="Replace and merge jobs report what they change in their range, per day and series "
        "(rows only before, only after, in both, values changed, sum and count deltas: `timelake backfill diff JOB`); "
        "false (`--no-diff`) leaves it out and spares reading main's rows of the range once more")
    precision: TimeUnit | None = Field(default=None, description="Timestamp unit of line-protocol files (default ns)")

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, tz: str | None) -> str | None:
        if tz is not None and not known_zone(tz):
            raise ValueError(f"unknown time zone '{printable(tz)[:100]}' (use an IANA name such as Europe/Berlin)")
        return tz

    @field_validator("run_between")
    @classmethod
    def _window(cls, text: str | None) -> str | None:
        if text is not None:
            Window.parse(printable(text))
        return text

    @field_validator("run_tz")
    @classmethod
    def _run_zone(cls, tz: str | None) -> str | None:
        if tz is not None and not known_zone(tz):
            raise ValueError(f"unknown time zone '{printable(tz)[:100]}' (use an IANA name such as Europe/Berlin)")
        return tz

    @field_validator("max_rejected", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        """A count or a percentage; the command line gives both as text."""
        if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
            value = int(value)
        if isinstance(value, bool) or not (value is None or isinstance(value, int) and value >= 0
                                           or isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?%", value.strip())):
            raise ValueError("max_rejected is a row count (e.g. 100) or a percentage of the source rows (e.g. '0.5%')")
        return value.strip() if isinstance(value, str) else value

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, encoding: str) -> str:
        import codecs

        try:
            codecs.lookup(encoding)
        except LookupError:
            raise ValueError(f"unknown encoding '{printable(encoding)[:40]}' (examples: utf-8, latin-1, cp1252)") from None
        return encoding

    @field_validator("source")
    @classmethod
    def _no_password(cls, source: str) -> str:
        """The job JSON is stored and shown: a password in a URI would end up in both."""
        if not source.strip():
            raise ValueError("the source is empty; give a path, glob or URI")
        if uri_password(source):
            raise ValueError(f"the source URI holds a password; {PASSWORD_WAYS}")
        return source

    @field_validator("table")
    @classmethod
    def _qualified(cls, table: str) -> str:
        parts = table.split(".")
        if len(parts) < 2 or not all(p.strip() == p and p and p.isprintable() for p in parts) or len(table) > 255:
            raise ValueError(f"table '{printable(table)[:100]}' must be namespace.name, e.g. iot.sensor")
        return table

    @field_validator("reason")
    @classmethod
    def _reason_text(cls, reason: str | None) -> str | None:
        """One line of text: it lands in a snapshot summary and in a table row that any engine shows."""
        if reason is not None:
            if not reason.strip():
                raise ValueError("reason is empty; say why the job runs, or leave it out")
            if not reason.isprintable():
                raise ValueError("reason holds control characters (a newline, a tab); give one line of text")
        return reason

    @field_validator("assertions")
    @classmethod
    def _no_blank_assertion(cls, assertions: list[str]) -> list[str]:
        blank = [i for i, sql in enumerate(assertions) if not sql.strip()]
        if blank:
            raise ValueError(f"assertion {blank[0]} is empty; give SQL over the view staged that returns the failing rows")
        return assertions

    @field_validator("canary", mode="before")
    @classmethod
    def _day_not_number(cls, canary: Any) -> Any:
        if isinstance(canary, int | float) and not isinstance(canary, bool):
            raise ValueError("canary is a day (YYYY-MM-DD) or true, not a number")
        return canary

    @model_validator(mode="before")
    @classmethod
    def _bounds_in_tz(cls, data: Any) -> Any:
        if isinstance(data, dict):
            tz = data.get("tz")
            if tz is not None and (not isinstance(tz, str) or not known_zone(tz)):
                return data  # the tz field reports it
            for key in ("start", "end"):
                if isinstance(data.get(key), str | datetime):
                    data[key] = _bounded(key, data[key], tz)
                elif data.get(key) is not None:
                    raise ValueError(f"{key} is an ISO date or time (example: 2024-01-01T00:00:00Z)")
        return data

    @model_validator(mode="after")
    def _separators(self) -> JobSpec:
        if self.thousands is not None and self.thousands == self.decimal:
            raise ValueError(f"thousands and decimal are both '{self.thousands}'; they must differ")
        if (self.id_columns or self.key_separator) and not self.wide:
            raise ValueError("id_columns and key_separator describe a wide source; add wide (--wide)")
        return self

    @model_validator(mode="after")
    def _ordered(self) -> JobSpec:
        if self.start and self.end and self.start >= self.end:
            raise ValueError(f"start {self.start.isoformat()} must be before end {self.end.isoformat()}")
        # in-memory data ("<...>") may keep the query that produced it, as a record of the job
        if self.query is not None and not self.source.startswith(("postgresql://", "postgres://", "duckdb:", "<")):
            raise ValueError("query applies to a PostgreSQL source (postgresql://...) or a DuckDB one (--from-sql) only")
        return self

    @model_validator(mode="after")
    def _zone_of_window(self) -> JobSpec:
        if self.run_tz is not None and self.run_between is None:
            raise ValueError("run_tz is the zone of run_between; give run_between (e.g. --run-between 22:00-06:00)")
        return self

    def window(self) -> Window | None:
        """The job's quiet hours (`window_of`)."""
        return window_of({"run_between": self.run_between, "run_tz": self.run_tz, "tz": self.tz})

    def to_json(self) -> dict:
        return json.loads(self.model_dump_json())


#: the fields `timelake backfill set` changes on a job that has not finished; kept in its state as ``settings``
SETTINGS = ("max_concurrency", "source_rows_per_second")
#: a settings change, checked as the job model checks those fields (the same bounds and descriptions)
_SETTING_FIELDS: dict[str, Any] = {name: (JobSpec.model_fields[name].annotation, JobSpec.model_fields[name]) for name in SETTINGS}
Settings = create_model("Settings", __config__=ConfigDict(extra="forbid"), **_SETTING_FIELDS)


def current_spec(spec: dict[str, Any], state: JobState) -> JobSpec:
    """A job's spec with the settings changed since it was submitted: what its steps go by."""
    return JobSpec.model_validate({**spec, **state.get("settings", {})})


def current_setting(job: JobRecord, name: str) -> Any:
    """One of `SETTINGS` as the job has it now, without validating the whole spec (read as units finish)."""
    return job.state.get("settings", {}).get(name, job.spec.get(name))


def known_zone(tz: str) -> bool:
    """Whether ``tz`` names an IANA zone; ZoneInfo raises KeyError, ValueError or OSError for the rest."""
    from zoneinfo import ZoneInfo

    try:
        ZoneInfo(tz)
    except Exception:
        return False
    return True


def _bounded(key: str, value: str | datetime, tz: str | None) -> datetime:
    """A job bound in UTC, in years 1-9998 so that every partition and chunk after it still has a start."""
    try:
        instant = parse_instant(value, tz)
    except OverflowError:
        instant = None
    if instant is None or not FIRST_YEAR <= instant.year <= LAST_YEAR:
        raise ValueError(f"{key} must fall in the years {FIRST_YEAR}-{LAST_YEAR} (UTC)")
    return instant


def uri_password(source: str) -> bool:
    """Whether a URI carries a password: in its userinfo (``user:pw@``, the password may hold a raw ``/``
    or ``#``) or as a query parameter (``?password=``)."""
    if not _URI.match(source):
        return False
    rest = source.split("://", 1)[1]
    userinfo = rest.rpartition("@")[0]
    if ":" in userinfo and "/" not in userinfo.split(":", 1)[0]:
        return True
    query = source.partition("?")[2]
    return any(key.strip().lower() in _PASSWORD_PARAMS for key, _ in parse_qsl(query, keep_blank_values=True))


def printable(text: str) -> str:
    """``text`` without control characters, so echoing user input cannot drive the terminal."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def external_job(data: Any) -> JobSpec:
    """A job from outside the process (CLI job file and flags, the API): the same model, plus the rules
    that only in-process callers may break, so the CLI and the API refuse exactly the same documents."""
    if not isinstance(data, dict):
        raise ValueError(f"a job is a JSON object, not {type(data).__name__ if data is not None else 'null'}")
    spec = JobSpec.model_validate(data)
    if spec.source.startswith("<"):
        raise ValueError("source '<...>' names in-process data; give a path, glob or URI")
    return spec


def parse_document(text: str | bytes) -> Any:
    """A job JSON document, bounded before it is parsed: size, UTF-8 and nesting depth (a document nested
    thousands deep would exhaust the parser's recursion)."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"the job document is {len(text):,} bytes; at most {MAX_DOCUMENT_BYTES:,}", 413)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"the job document is not UTF-8 (byte {exc.start})") from None
    if nesting(text) > MAX_NESTING:
        raise DocumentError(f"the job document is nested more than {MAX_NESTING} deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"the job document is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def nesting(text: str) -> int:
    """Deepest nesting of ``[``/``{`` outside strings in JSON text."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
