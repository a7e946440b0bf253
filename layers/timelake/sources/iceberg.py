"""An existing Iceberg table (S3 Tables, Glue, SQL, REST: any pyiceberg catalog) as a backfill source.

``iceberg://CATALOG/ns.table`` or ``iceberg://CATALOG/ns.table@SNAPSHOT_ID``; CATALOG is a catalog
name configured the pyiceberg way (``.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__...``), so
credentials never enter the job JSON. A piece is the time range of one of the source's own time
partitions: each worker's scan filters on that range, and the source's manifests prune every other
partition, so a year of source data fans out without any worker opening files of another piece.
Ranges of files written under different partition specs (month, later day) are merged wherever they
overlap, so no row belongs to two pieces.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThan
from pyiceberg.table import DataScan
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import TimestampType, TimestamptzType
from timelake.errors import CatalogUnsupported
from timelake.model.timeutil import TRANSFORMS, iso, to_micros, transform_range
from timelake.ports.runtime import catalog_properties
from timelake.sources.base import Source, SourceBatch, SourceError, _rebatch

SCHEME = "iceberg://"
WHOLE = "all"  # the one piece of a table without a time partition


def is_iceberg_uri(uri: str) -> bool:
    return uri.startswith(SCHEME)


class IcebergSource(Source):
    """One snapshot of a table (the current one unless the URI names one), read per time partition."""

    def __init__(self, uri: str, batch_rows: int) -> None:
        self.uri = uri
        catalog_name, _, rest = uri.removeprefix(SCHEME).partition("/")
        identifier, _, snapshot = rest.partition("@")
        if not catalog_name or identifier.count(".") < 1:
            raise SourceError(f"'{uri}' must be iceberg://CATALOG/namespace.table[@snapshot_id]")
        try:
            props = catalog_properties(catalog_name, of=f" of source '{uri}'")
        except CatalogUnsupported as e:
            raise SourceError(str(e)) from None
        try:
            self.table = load_catalog(catalog_name, **props).load_table(identifier)
        except (NoSuchTableError, NoSuchNamespaceError) as e:
            raise SourceError(f"source table '{identifier}' does not exist in catalog '{catalog_name}'") from e
        except Exception as e:  # a catalog that is not configured or cannot be reached: pyiceberg raises many types
            raise SourceError(f"cannot open catalog '{catalog_name}' for source '{uri}': {e}") from e
        if snapshot:
            if not snapshot.isdigit() or self.table.snapshot_by_id(int(snapshot)) is None:
                raise SourceError(f"source table '{identifier}' has no snapshot '{snapshot}'")
            self.snapshot_id: int | None = int(snapshot)
        else:
            current = self.table.current_snapshot()
            self.snapshot_id = current.snapshot_id if current else None
        self._batch_rows = batch_rows
        self._ranges: list[tuple[int, int, int]] | None = None
        self._column: str | None = None

    def pieces(self) -> list[str]:
        ranges = self._time_ranges()
        return [WHOLE if self._column is None else f"{iso(lo)}/{iso(hi)}" for lo, hi, _ in ranges]

    def sizes(self) -> list[int]:
        return [size for *_, size in self._time_ranges()]

    def schema(self) -> pa.Schema:
        snapshot = self.table.snapshot_by_id(self.snapshot_id) if self.snapshot_id else None
        schemas = self.table.schemas()
        schema = schemas[snapshot.schema_id] if snapshot and snapshot.schema_id in schemas else self.table.schema()
        return schema.as_arrow()

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.uri}\0{self.snapshot_id}".encode()).hexdigest()

    def scan_for(self, piece: str) -> DataScan:
        """The pyiceberg scan of one piece: its time range as the row filter, so partitions are pruned."""
        if piece not in self.pieces():
            raise SourceError(f"{piece} is not a piece of source '{self.uri}'")
        row_filter: BooleanExpression = AlwaysTrue()
        if piece != WHOLE:
            lo, hi = (to_micros(datetime.fromisoformat(t)) for t in piece.split("/"))
            row_filter = And(GreaterThanOrEqual(self._column, lo), LessThan(self._column, hi))
        return self.table.scan(row_filter=row_filter, snapshot_id=self.snapshot_id)

    def batches(self, piece: str | None = None) -> Iterator[SourceBatch]:
        for name in [piece] if piece is not None else self.pieces():
            offset = 0
            for batch in _rebatch(self.scan_for(name).to_arrow_batch_reader(), self._batch_rows):
                yield SourceBatch(batch, f"{self.uri} {name}", offset)
                offset += batch.num_rows

    def _time_ranges(self) -> list[tuple[int, int, int]]:
        """Disjoint [lo, hi) microsecond ranges of the snapshot's time partitions with their file bytes."""
        if self._ranges is not None:
            return self._ranges
        if self.snapshot_id is None:
            self._ranges = []
            return self._ranges
        found: list[tuple[int, int, int]] = []
        specs = self.table.specs()
        columns = set()
        for task in self.table.scan(snapshot_id=self.snapshot_id).plan_files():
            located = self._partition_range(specs[task.file.spec_id], task.file.partition)
            if located is None:
                columns.add(None)
                found.append((0, 0, task.file.file_size_in_bytes))
                continue
            column, lo, hi = located
            columns.add(column)
            found.append((lo, hi, task.file.file_size_in_bytes))
        self._column = columns.pop() if len(columns) == 1 else None
        # Without one time column partitioning every file, the table is one piece (a full scan).
        self._ranges = _merged(found) if self._column is not None else [(0, 0, sum(s for *_, s in found))]
        return self._ranges

    def _partition_range(self, spec: Any, partition: Any) -> tuple[str, int, int] | None:
        schema = self.table.schema()
        for position, part in enumerate(spec.fields):
            source = schema.find_field(part.source_id)
            if not isinstance(source.field_type, TimestampType | TimestamptzType) or partition[position] is None:
                continue
            span = _span(part.transform, int(partition[position]))
            if span is not None:
                return source.name, *span
        return None


def _span(transform: Any, value: int) -> tuple[int, int] | None:
    """The microsecond range that one time-partition value covers (identity: one instant)."""
    if isinstance(transform, IdentityTransform):
        return value, value + 1
    name = str(transform)
    return transform_range(name, value) if name in TRANSFORMS else None


def _merged(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for lo, hi, size in sorted(ranges):
        if out and lo < out[-1][1]:
            prev_lo, prev_hi, prev_size = out[-1]
            out[-1] = (prev_lo, max(prev_hi, hi), prev_size + size)
        else:
            out.append((lo, hi, size))
    return out
