"""A DuckDB query as a backfill source (``--from-sql``): anything DuckDB reads locally, joined or filtered.

The job stores the query text (``query``) and the database (``source``: ``duckdb:`` for a fresh
in-memory database, ``duckdb:PATH`` for a database file, opened read-only), so any worker can re-run
it: there is no state to hand over. The query is one piece, streamed in Arrow batches; splitting it
by time would make DuckDB re-read inputs such as CSV files, which it cannot prune, once per piece.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa

from timelake.sources.base import Source, SourceBatch, SourceError

if TYPE_CHECKING:
    import duckdb

SCHEME = "duckdb:"
PIECE = "query"


def is_duckdb_uri(uri: str) -> bool:
    return uri.startswith(SCHEME)


class DuckDBSource(Source):
    def __init__(self, uri: str, query: str | None, batch_rows: int) -> None:
        if not query or not query.strip():
            raise SourceError(f"source '{uri}' needs a query (--from-sql \"SELECT ...\")")
        self.uri = uri
        self.query = query
        self.database = uri.removeprefix(SCHEME).removeprefix("//") or ":memory:"
        if self.database != ":memory:" and not os.path.exists(self.database):
            raise SourceError(f"DuckDB database {self.database} does not exist")
        self._batch_rows = batch_rows

    def pieces(self) -> list[str]:
        return [PIECE]

    def sizes(self) -> list[int]:
        return [0]

    def schema(self) -> pa.Schema:
        with self._connect() as con, self._failing():
            return con.sql(f"SELECT * FROM ({self.query}) LIMIT 0").to_arrow_table().schema

    def fingerprint(self) -> str:
        """The query and the database file's size and mtime: the files a query reads are its own business."""
        stamp = os.stat(self.database) if self.database != ":memory:" else None
        text = f"{self.database}\0{stamp and (stamp.st_size, stamp.st_mtime_ns)}\0{self.query}"
        return hashlib.sha256(text.encode()).hexdigest()

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        if piece not in (None, PIECE):
            raise SourceError(f"{piece} is not a piece of source '{self.uri}'")
        offset = 0
        with self._connect() as con, self._failing():
            for batch in con.sql(self.query).to_arrow_reader(self._batch_rows):
                yield SourceBatch(batch, "the query", offset)
                offset += batch.num_rows

    def _connect(self) -> duckdb.DuckDBPyConnection:
        import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
        try:
            return duckdb.connect(self.database, read_only=self.database != ":memory:")
        except duckdb.Error as e:
            raise SourceError(f"cannot open DuckDB database {self.database}: {e}") from e

    @contextmanager
    def _failing(self) -> Iterator[None]:
        """A query fails when bound or while its rows stream; either way the user sees DuckDB's reason.
        Mid-stream, the failure reaches Python through Arrow's C stream as a plain ``OSError``."""
        import duckdb  # lazily: functions that never reach this leave DuckDB out of their layers
        try:
            yield
        except (duckdb.Error, pa.ArrowException, OSError) as e:
            raise SourceError(f"the source query failed: {reason(e)}") from e


def reason(error: BaseException) -> str:
    """DuckDB's reason in one line: its first paragraph. What follows a blank line (the reader's
    options, "Possible solutions" for a CSV it sniffed) runs to thirty lines."""
    return " ".join(str(error).strip().split("\n\n", 1)[0].split())
