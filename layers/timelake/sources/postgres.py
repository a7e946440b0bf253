"""PostgreSQL and TimescaleDB as a backfill source, read through ADBC as Arrow batches.

``postgresql://user@host:port/db?table=schema.name`` reads a table (a TimescaleDB hypertable is a
table to us); a ``query`` reads the result of any SELECT. A piece is a range of the source's time
column, ``[lo, hi)``, read with that predicate pushed down, so every scan task reads only its own
rows and tasks read in parallel, each on its own connection.

Planning must not load the source: the time range comes from ``min()/max()`` of the time column
(answered from an index when there is one) and the row estimate from the planner (``EXPLAIN``,
i.e. ``pg_class`` statistics), never from a count. When TimescaleDB's chunk catalog is present,
pieces follow chunk boundaries, so each piece reads whole chunks; it is never required.

The pieces are decided once, at plan time, and handed back (``planned``) to every scan process:
a live database keeps receiving rows, and re-deriving the ranges later would shift them.

A piece is read completely before any of its rows leave the source. A connection dropped halfway
(a failover, ``pg_terminate_backend``, a network blip) then re-reads the piece from the start and no
row is ever passed on twice; pieces are sized (``piece_rows``) so that this buffer stays small.

The password never appears in the URI (the job JSON stores the URI): it comes from ``PGPASSWORD``,
from the variable named by ``password_env=``, or from an AWS Secrets Manager secret
(``secret=arn:...``: a plain string, or JSON with ``password`` as RDS writes it). Error messages
are scrubbed of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC
from itertools import pairwise
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit
from zoneinfo import ZoneInfo

import pyarrow as pa

from timelake.model.limits import POSTGRES_SCHEMES
from timelake.model.timeutil import US_PER_DAY, from_micros, iso, partition_starts, to_micros
from timelake.sources.base import Source, SourceBatch, SourceError, _rebatch

SCHEMES = POSTGRES_SCHEMES
PIECE_ROWS = 250_000  # rows per piece: the re-read buffer on a dropped connection (~10 MB of Arrow)
ATTEMPTS = 4  # reads of one piece before its scan task fails
READ_AHEAD = 2  # pieces read ahead of the one the scan maps: with one, the reader waited whenever a piece mapped slowly
# The plan is kept in the job state (one DynamoDB item on AWS, 400 KB at most): larger tables get larger pieces.
MAX_PIECES = 2_000
# Our own query parameters; everything else in the query string is handed to libpq (sslmode, ...).
_OWN_PARAMS = ("table", "secret", "password_env", "piece_rows")
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}
_TIME_TYPES = {"timestamptz": "timestamptz", "timestamp": "timestamp", "int2": "integer", "int4": "integer",
               "int8": "integer"}
# What libpq says when a connection is lost (server shutdown or pg_terminate_backend: SQLSTATE 57P01).
_DROPPED = ("terminating connection", "server closed the connection", "could not receive data", "could not send data",
            "connection reset", "connection timed out", "no connection to the server", "ssl syscall")
_NAME = re.compile(r'^(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\.(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?$')


def is_postgres(uri: Any) -> bool:
    return isinstance(uri, str) and uri.startswith(SCHEMES)


def open_for_job(spec: Any, time_column: str, planned: dict[str, Any] | None = None,
                 partition: str | None = None) -> PostgresSource:
    """The source of a job (a `JobSpec`) whose table's time column is ``time_column``, partitioned by
    the time transform ``partition`` (None when the table has several tiers)."""
    return PostgresSource(
        spec.source, time_column=spec.map.get(time_column, time_column), query=spec.query, tz=spec.tz,
        time_unit=spec.time_unit, start_us=to_micros(spec.start) if spec.start else None,
        end_us=to_micros(spec.end) if spec.end else None, planned=planned, partition=partition,
    )


@dataclass(frozen=True)
class _Target:
    """Where to connect and what to read, parsed from the URI; ``libpq_uri`` carries no password."""

    libpq_uri: str
    table: str | None
    secret: str | None
    password_env: str | None
    piece_rows: int


def _parse(uri: str, query: str | None) -> _Target:
    parts = urlsplit(uri)
    if parts.password is not None:
        raise SourceError("the PostgreSQL URI holds a password; pass it through PGPASSWORD, password_env=VAR or secret=ARN")
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    own = {k: params.pop(k) for k in _OWN_PARAMS if k in params}
    table = own.get("table") or None
    if (table is None) == (query is None):
        raise SourceError(f"source '{uri}': give either ?table=schema.name in the URI or a query, not "
                          + ("both" if table else "neither"))
    if table is not None and not _NAME.match(table):
        raise SourceError(f"source '{uri}': '{table}' is not a table name (schema.name)")
    try:
        piece_rows = int(own.get("piece_rows", PIECE_ROWS))
    except ValueError:
        piece_rows = 0
    if piece_rows < 1:
        raise SourceError(f"source '{uri}': piece_rows must be a positive integer")
    libpq = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(params), ""))
    return _Target(libpq, table, own.get("secret"), own.get("password_env"), piece_rows)


def _password(target: _Target) -> str | None:
    """The password from the environment or Secrets Manager; None lets libpq use its own defaults
    (PGPASSWORD, ~/.pgpass, trust)."""
    if target.password_env:
        if target.password_env not in os.environ:
            raise SourceError(f"password_env={target.password_env}: that environment variable is not set")
        return os.environ[target.password_env]
    if target.secret:
        import boto3

        try:
            text = boto3.client("secretsmanager").get_secret_value(SecretId=target.secret)["SecretString"]
        except Exception as exc:
            raise SourceError(f"cannot read secret {target.secret}: {type(exc).__name__}: {exc}") from exc
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, dict):
            if "password" not in value:
                raise SourceError(f"secret {target.secret} is JSON without a 'password' key")
            return str(value["password"])
        return text
    return None


class PostgresSource(Source):
    """A table or query of a PostgreSQL database, cut into time-range pieces."""

    def __init__(
        self, uri: str, *, time_column: str, query: str | None = None, tz: str | None = None,
        time_unit: str | None = None, start_us: int | None = None, end_us: int | None = None,
        batch_rows: int = 262_144, planned: dict[str, Any] | None = None, partition: str | None = None,
    ) -> None:
        self._con: Any = None
        self.uri = uri
        self._target = _parse(uri, query)
        self._query = query
        self._time_column = time_column
        self._tz, self._time_unit = tz, time_unit
        self._bounds = (start_us, end_us)
        self._batch_rows = batch_rows
        self._secret: str | None = None
        self._pace: Callable[[int], None] | None = None
        self._schema: pa.Schema | None = None
        self._ahead: ThreadPoolExecutor | None = None
        self._using = threading.RLock()  # the connection, shared by the caller and the read-ahead thread
        self._next: list[str] = []  # read_next's hint
        self._early: dict[str, Future] = {}  # a piece read before the read() that wants it
        self._partition = partition
        self._plan = planned or self._make_plan()

    # --- Source ---------------------------------------------------------------------------------

    def pieces(self) -> list[str]:
        return [self._piece_name(lo, hi) for lo, hi in self._ranges()]

    def schema(self) -> pa.Schema:
        if self._schema is None:
            self._schema = self._fetch(f"SELECT * FROM ({self._base()}) AS src LIMIT 0").schema
        return self._schema

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        return self.read(self.pieces() if piece is None else [piece])

    def read(self, pieces: list[str]) -> Iterator[SourceBatch]:
        """The pieces in order, up to READ_AHEAD of the next ones read while the caller maps and spills
        this one: the server, the driver (which decodes outside the GIL) and the mapping then work at
        once, and the reader never waits for the caller to ask for the next piece. The pieces named by
        ``read_next`` follow this read's last piece, for the next read to take."""
        ranges = dict(zip(self.pieces(), self._ranges(), strict=True))
        unknown = [p for p in [*pieces, *self._next] if p not in ranges]
        if unknown:
            raise SourceError(f"{unknown[0]} is not a piece of source '{self.uri}'")
        if self._ahead is None:
            self._ahead = ThreadPoolExecutor(1, thread_name_prefix="postgres-read-ahead")
        ahead = self._ahead
        order = [*pieces, *(p for p in self._next if p not in pieces)]
        self._next = []
        early, self._early = self._early, {}
        pending: deque[Future] = deque()

        def fill(upto: int) -> None:
            while len(pending) + done < min(upto, len(order)):
                piece = order[len(pending) + done]
                pending.append(early.pop(piece) if piece in early else ahead.submit(self._read_piece, piece, *ranges[piece]))

        done = 0
        for piece in pieces:
            fill(done + 1 + READ_AHEAD)
            batches = pending.popleft().result()
            done += 1
            fill(done + READ_AHEAD)
            offset = 0
            for batch in _rebatch(batches, self._batch_rows):
                yield SourceBatch(batch, piece, offset)
                offset += batch.num_rows
        self._early = dict(zip(order[done:done + len(pending)], pending, strict=True))

    def read_next(self, pieces: list[str]) -> None:
        self._next = pieces[:READ_AHEAD]

    def fingerprint(self) -> str:
        """The relation's OID (or the query text), the planned ranges and the planner's row estimate:
        cheap, and it changes when the table is replaced, the range moves or the row count changes
        enough for the statistics to notice. It cannot see an UPDATE of a value in place; nothing
        short of reading the rows can."""
        plan = self._plan
        digest = json.dumps([plan["relation"], plan["kind"], plan["edges"], plan["rows"]], sort_keys=True)
        return hashlib.sha256(digest.encode()).hexdigest()

    def sizes(self) -> list[int]:
        """Estimated bytes per piece (rows × the planner's row width), so scan tasks come out even."""
        width = self._plan["width"]
        return [max(1, round(rows * width)) for rows in self._plan["piece_rows"]]

    def on_partition_edges(self) -> bool:
        return bool(self._plan.get("aligned"))

    def column_bounds(self, column: str) -> list[tuple[pa.DataType, int, int, int]] | None:
        """Each piece's time range as bounds of the time column (its rows: the planner's estimate): a
        piece holds exactly the rows of its range, whatever they are."""
        if column != self._time_column or self._plan["kind"] != "timestamptz":
            return None
        kind = self.schema().field(self._source_field()).type
        return [(kind, lo, hi - 1, rows) for (lo, hi), rows in zip(self._ranges(), self._plan["piece_rows"], strict=True)]

    def plan_state(self) -> dict[str, Any]:
        """What another process needs to see the same pieces (stored with the job)."""
        return dict(self._plan)

    def pace(self, take: Callable[[int], None], rows_per_second: int) -> None:
        """``take(n)`` blocks until n more rows fit the job's rate; it is called after every batch
        fetched from the server, so the server is read at that rate (the open COPY waits between
        batches) rather than in bursts. Batches then hold about 1/20 s of the rate, which keeps the
        rate even at the scale of a second."""
        self._pace = take
        self._pace_batch_bytes = max(16 << 10, round(rows_per_second * self._plan["width"] / 20))

    # --- planning -------------------------------------------------------------------------------

    def _make_plan(self) -> dict[str, Any]:
        column = self.schema().field(self._source_field()).metadata or {}
        pg_type = column.get(b"POSTGRESQL:type", b"").decode()
        kind = _TIME_TYPES.get(pg_type)
        if kind is None:
            raise SourceError(f"source '{self.uri}': time column '{self._time_column}' is {pg_type or 'of an unknown type'}; "
                              "a PostgreSQL source needs timestamptz, timestamp or an integer epoch column")
        self._kind = kind
        col = _ident(self._time_column)
        as_int = "(extract(epoch from {}) * 1000000)::int8" if kind != "integer" else "{}::int8"
        within = self._where(*self._domain_bounds(), kind)  # the job's range, so min/max and the estimate use the index
        lo, hi = self._fetch(
            f"SELECT {as_int.format(f'min({col})')} AS lo, {as_int.format(f'max({col})')} AS hi "
            f"FROM ({self._base()}) AS src{within}"
        ).to_pylist()[0].values()
        rows, width = self._estimate(within)
        table = self._target.table
        relation = self._relation_oid(table) if table else self._query
        plan: dict[str, Any] = {"relation": relation, "kind": kind, "rows": rows, "width": width,
                                "edges": [], "piece_rows": []}
        if lo is None:
            return plan
        hi += 1
        chunks = self._chunks(table, lo, hi) if kind != "integer" and table else None
        aligned = self._aligned(lo, hi, rows) if not chunks else None
        if chunks:
            plan["edges"] = [lo, *[c[1] for c in chunks[:-1]], hi]
            plan["piece_rows"] = [round(c[2]) for c in chunks]
        elif aligned:
            plan["edges"], plan["aligned"] = aligned, True
            plan["piece_rows"] = [round(rows * (b - a) / (hi - lo)) for a, b in pairwise(aligned)]
        else:  # equal spans: rows are assumed to spread evenly over the range
            count = min(MAX_PIECES, max(1, math.ceil(rows / self._target.piece_rows)))
            plan["edges"] = sorted({lo + (hi - lo) * i // count for i in range(count)} | {hi})
            plan["piece_rows"] = [round(rows / count)] * (len(plan["edges"]) - 1)
        return plan

    def _aligned(self, lo: int, hi: int, rows: float) -> list[int] | None:
        """Edges on the table's partition boundaries, a whole number of partitions a piece, when the
        time column is absolute (UTC microseconds) and a partition holds at most two pieces' rows: then
        no partition straddles two pieces, and a scan task writes each partition itself as soon as its
        piece is read (`plan.plan_direct`), without the spill's round trip."""
        if self._partition is None or self._kind != "timestamptz":
            return None
        starts = partition_starts(lo, hi - 1, self._partition, MAX_PIECES * 8)
        if starts is None:
            return None
        partitions = len(starts) + 1
        if rows / partitions > 2 * self._target.piece_rows:
            return None
        per_piece = max(1, round(self._target.piece_rows / max(rows / partitions, 1)), math.ceil(partitions / MAX_PIECES))
        return [*[lo, *starts][::per_piece], hi]

    def _source_field(self) -> str:
        if self._time_column not in self.schema().names:
            raise SourceError(f"source '{self.uri}' has no column '{self._time_column}' (the time column); "
                              f"it has {', '.join(self.schema().names)}. Select it or map it with --map")
        return self._time_column

    def _estimate(self, within: str) -> tuple[float, float]:
        """The planner's row count and row width for the source's rows in range: statistics, not a count."""
        sql = f"EXPLAIN (FORMAT JSON) SELECT * FROM ({self._base()}) AS src{within}"
        plan = json.loads(self._fetch(sql, copy=False).column(0)[0].as_py())
        top = plan[0]["Plan"]
        return float(top["Plan Rows"]), float(top["Plan Width"])

    def _relation_oid(self, table: str) -> int:
        return int(self._fetch(f"SELECT {_literal(table)}::regclass::oid::int8 AS oid").column(0)[0].as_py())

    def _chunks(self, table: str, lo: int, hi: int) -> list[tuple[int, int, float]] | None:
        """TimescaleDB chunks overlapping [lo, hi) as (start, end, estimated rows), when the catalog exists."""
        present = self._fetch("SELECT to_regclass('timescaledb_information.chunks') IS NOT NULL AS present").column(0)[0]
        if not present.as_py():
            return None
        schema, _, name = table.rpartition(".")
        rows = self._fetch(f"""
            SELECT (extract(epoch from range_start) * 1000000)::int8 AS lo,
                   (extract(epoch from range_end) * 1000000)::int8 AS hi,
                   greatest(coalesce((SELECT c.reltuples FROM pg_class c
                       WHERE c.oid = to_regclass(format('%I.%I', chunk_schema, chunk_name))), 0), 0)::float8 AS n
            FROM timescaledb_information.chunks
            WHERE hypertable_schema = {_literal(_unquote(schema) or 'public')} AND hypertable_name = {_literal(_unquote(name))}
              AND range_end > {_literal_time(lo, self._kind)} AND range_start < {_literal_time(hi, self._kind)}
            ORDER BY range_start""").to_pylist()
        return [(max(r["lo"], lo), min(r["hi"], hi), r["n"]) for r in rows] or None

    def _domain_bounds(self) -> tuple[int | None, int | None]:
        """The job's [start, end) in the time column's own terms, so the predicate can use its index.
        Naive local times are widened by a day, which covers every UTC offset and DST shift; the
        scan then cuts the rows to the exact range as for any source."""
        start, end = self._bounds
        if self._kind == "timestamptz":
            return start, end
        if self._kind == "timestamp":
            zone = ZoneInfo(self._tz) if self._tz else UTC

            def wall(us: int | None, margin: int) -> int | None:
                return None if us is None else to_micros(from_micros(us).astimezone(zone).replace(tzinfo=UTC)) + margin

            return wall(start, -US_PER_DAY), wall(end, US_PER_DAY)
        per = _UNIT_US.get(self._time_unit or "")
        if per is None:
            return None, None
        if per == 0:  # nanoseconds
            return (start * 1000 if start is not None else None), (end * 1000 if end is not None else None)
        return (start // per if start is not None else None), (-(-end // per) if end is not None else None)

    def _ranges(self) -> list[tuple[int, int]]:
        edges = self._plan["edges"]
        return list(pairwise(edges))

    def _piece_name(self, lo: int, hi: int) -> str:
        if self._plan["kind"] == "integer":
            return f"{self._time_column} in [{lo}, {hi})"
        fmt = (lambda us: iso(us)) if self._plan["kind"] == "timestamptz" else (lambda us: iso(us).removesuffix("Z"))
        return f"{self._time_column} in [{fmt(lo)}, {fmt(hi)})"

    # --- reading --------------------------------------------------------------------------------

    def _base(self) -> str:
        return self._query.strip().rstrip(";") if self._query else f"SELECT * FROM {self._target.table}"

    def _piece_sql(self, lo: int, hi: int) -> str:
        return f"SELECT * FROM ({self._base()}) AS src{self._where(lo, hi, self._plan['kind'])}"

    def _where(self, lo: int | None, hi: int | None, kind: str) -> str:
        """`` WHERE col >= lo AND col < hi`` with the bounds given, as typed literals."""
        col = _ident(self._time_column)
        terms = [f"{col} {op} {_literal_time(v, kind)}" for op, v in ((">=", lo), ("<", hi)) if v is not None]
        return f" WHERE {' AND '.join(terms)}" if terms else ""

    def _read_piece(self, name: str, lo: int, hi: int) -> list[pa.RecordBatch]:
        """The whole piece, re-read from the start when the connection drops (see the module doc)."""
        for attempt in range(ATTEMPTS):
            try:
                with self._using:
                    return list(self._stream(self._piece_sql(lo, hi)))
            except SourceError as exc:
                if not exc.__cause__ or not _dropped(exc.__cause__) or attempt == ATTEMPTS - 1:
                    raise SourceError(f"{name} of source '{self.uri}': {exc}") from exc
                self._close()
                time.sleep(0.2 * 2 ** attempt)
        raise AssertionError("unreachable")

    def _stream(self, sql: str) -> Iterator[pa.RecordBatch]:
        cursor = self._cursor()
        try:
            if self._pace is not None:
                cursor.adbc_statement.set_options(**{_option("BATCH_SIZE_HINT_BYTES"): str(self._pace_batch_bytes)})
            cursor.execute(sql)
            for batch in cursor.fetch_record_batch():
                yield batch
                if self._pace is not None:
                    self._pace(batch.num_rows)
        except _adbc_errors() as exc:
            raise self._error(exc) from exc
        finally:
            cursor.close()

    def _fetch(self, sql: str, copy: bool = True) -> pa.Table:
        with self._using:
            return self._fetch_now(sql, copy)

    def _fetch_now(self, sql: str, copy: bool) -> pa.Table:
        cursor = self._cursor()
        try:
            if not copy:  # EXPLAIN cannot run inside COPY, which the driver uses for results by default
                cursor.adbc_statement.set_options(**{_option("USE_COPY"): "false"})
            cursor.execute(sql)
            return cursor.fetch_arrow_table()
        except _adbc_errors() as exc:
            raise self._error(exc) from exc
        finally:
            cursor.close()

    def _cursor(self) -> Any:
        if self._con is None:
            from adbc_driver_postgresql import dbapi

            if self._secret is None:
                self._secret = _password(self._target) or ""
            uri = self._target.libpq_uri
            if self._secret:
                parts = urlsplit(uri)
                user = quote(parts.username or "", safe="")
                host = parts.netloc.rpartition("@")[2]
                uri = urlunsplit((parts.scheme, f"{user}:{quote(self._secret, safe='')}@{host}", parts.path, parts.query, ""))
            try:
                self._con = dbapi.connect(uri, autocommit=True)
            except _adbc_errors() as exc:
                raise self._error(exc, connecting=True) from exc
            self._serial()
        return self._con.cursor()

    def _serial(self) -> None:
        """One connection, one backend: no parallel workers for our queries. A piece is a small range
        read through the time index, for which the planner would start a parallel bitmap scan; its
        workers come out of the pool the server's own clients need, and gathering their rows cost
        the server 2.4 times the CPU of a serial read of the same rows (bench/bench_postgres.py)."""
        cursor = self._con.cursor()
        try:
            cursor.adbc_statement.set_options(**{_option("USE_COPY"): "false"})
            cursor.execute("SET max_parallel_workers_per_gather = 0")
        except _adbc_errors() as exc:
            raise self._error(exc, connecting=True) from exc
        finally:
            cursor.close()

    def __del__(self) -> None:
        ahead = getattr(self, "_ahead", None)  # None also when __init__ failed before setting it
        if ahead is not None:
            ahead.shutdown(wait=True, cancel_futures=True)
        self._close()

    def _close(self) -> None:
        if self._con is not None:
            with contextlib.suppress(Exception):  # a dropped connection may refuse even to close
                self._con.close()
            self._con = None

    def _error(self, exc: Exception, connecting: bool = False) -> SourceError:
        """One line, naming the source and what the server said, without the password."""
        text = str(exc)
        for secret in {self._secret or "", quote(self._secret or "", safe="")} - {""}:
            text = text.replace(secret, "***")
        text = re.sub(r"\s*Query was:.*", "", text, flags=re.S)
        text = " ".join(re.sub(r"^[A-Z_]+: (\[libpq\] )?", "", text).split())
        what = "cannot connect to" if connecting else "cannot read"
        return SourceError(f"{what} PostgreSQL source '{self.uri}': {text}")


def _dropped(exc: BaseException) -> bool:
    """A lost connection (worth a re-read), as opposed to a bad query, a refused login or permissions."""
    text = str(exc).lower()
    return any(marker in text for marker in _DROPPED)


def _adbc_errors() -> tuple[type[Exception], ...]:
    """The driver's errors, and the OSError its Arrow stream raises when the server fails mid-result."""
    from adbc_driver_manager import Error

    return (Error, OSError)


def _option(name: str) -> str:
    from adbc_driver_postgresql import StatementOptions

    return StatementOptions[name].value


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith('"') and name.endswith('"') else name.lower()


def _literal_time(value: int, kind: str) -> str:
    """A bound as a typed SQL literal: the planner then matches it against the column's index."""
    if kind == "integer":
        return str(int(value))
    text = from_micros(value).strftime("%Y-%m-%d %H:%M:%S.%f")
    return f"'{text}+00'::timestamptz" if kind == "timestamptz" else f"'{text}'::timestamp"
