"""The table contract: what the engine needs to know about a table, read from the table itself.

Everything lives in Iceberg table properties and the partition specs, so any Iceberg reader (and
any other writer) sees the same contract and there is no side database to drift out of sync.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyiceberg
from pyiceberg.table import Table as IcebergTable
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, YearTransform

from timelake.model.parquet_settings import ParquetSettings
from timelake.model.timeutil import floor_to, parse_duration, subtract_duration, to_micros

TIME_COLUMN = "timelake.time-column"
SERIES_KEY = "timelake.series-key"
DEDUP_KEY = "timelake.dedup-key"
RETENTION = "timelake.retention"
PARTITION_TIERS = "timelake.partition-tiers"
CHECK_COLUMN = "timelake.check-column"
TARGET_FILE_SIZE = "write.target-file-size-bytes"
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024

TRANSFORM_CLASSES = {"hour": HourTransform, "day": DayTransform, "month": MonthTransform, "year": YearTransform}
_ORDER = ("hour", "day", "month", "year")


@dataclass(frozen=True)
class Tier:
    """Rows younger than ``max_age`` (None: any age) are partitioned by ``transform`` in spec ``spec_id``."""

    max_age: str | None
    transform: str
    spec_id: int


@dataclass(frozen=True)
class Contract:
    time_column: str
    series_key: tuple[str, ...]
    dedup_key: tuple[str, ...]
    retention: str | None
    tiers: tuple[Tier, ...]
    target_file_size: int
    check_column: str | None
    parquet: ParquetSettings = ParquetSettings()

    @property
    def sort_columns(self) -> list[str]:
        """The order every file we write is sorted in: series key, time, then any other dedup columns."""
        names = [*self.series_key, self.time_column]
        return names + [c for c in self.dedup_key if c not in names]

    @classmethod
    def from_table(cls, table: IcebergTable) -> Contract:
        props = table.properties
        time_column = props.get(TIME_COLUMN)
        if not time_column:
            raise ValueError(
                f"table {'.'.join(table.name())} has no '{TIME_COLUMN}' property: create it with "
                "timelake (create_table) or set the property to its event-time column"
            )
        series = tuple(c for c in props.get(SERIES_KEY, "").split(",") if c)
        dedup = tuple(c for c in props.get(DEDUP_KEY, "").split(",") if c) or (*series, time_column)
        _named_columns_exist(table, {TIME_COLUMN: (time_column,), SERIES_KEY: series, DEDUP_KEY: dedup})
        if PARTITION_TIERS in props:
            tiers = tuple(Tier(**t) for t in json.loads(props[PARTITION_TIERS]))
        else:
            tiers = (Tier(None, _spec_transform(table, table.spec().spec_id, time_column), table.spec().spec_id),)
        check = props.get(CHECK_COLUMN) or _first_numeric(table.schema().as_arrow(), set(dedup))
        return cls(
            time_column=time_column,
            series_key=series,
            dedup_key=dedup,
            retention=props.get(RETENTION) or None,
            tiers=tiers,
            target_file_size=int(props.get(TARGET_FILE_SIZE, DEFAULT_TARGET_FILE_SIZE)),
            check_column=check,
            parquet=ParquetSettings.from_properties(props),
        )

    def tier_cutoffs(self, now: datetime) -> list[int]:
        """Lower time bound (UTC µs) of each tier but the last.

        A cutoff is floored to the next tier's granularity so that a coarse partition (a month, a
        year) is never split between two tiers.
        """
        cutoffs = []
        for tier, coarser in pairwise(self.tiers):
            assert tier.max_age is not None
            cutoffs.append(floor_to(to_micros(subtract_duration(now, tier.max_age)), coarser.transform))
        return cutoffs

    def tier_index(self, micros: np.ndarray, cutoffs: list[int]) -> np.ndarray:
        """Which tier each row belongs to (0 = youngest)."""
        index = np.zeros(len(micros), dtype=np.int8)
        for i, cutoff in enumerate(cutoffs):
            index[micros < cutoff] = i + 1
        return index


WRITABLE_FORMAT = 2  # the newest Iceberg format version pyiceberg writes metadata for


def writable_spec(table: IcebergTable, time_column: str) -> None:
    """Refuse, before a job plans, a table the engine cannot write: a format version its commits cannot
    write (Iceberg Java upgrades a table to v3 on ``'format-version' = '3'``; pyiceberg writes v1 and v2
    metadata only, so the job would write its files and then fail at its first commit), or a partition
    spec that besides the time column's hour/day/month/year holds anything but removed (void) fields.
    Another engine may have added one (a bucket of the series key, say); files the engine wrote before
    keep their spec and stay readable."""
    from pyiceberg.transforms import VoidTransform

    if table.format_version > WRITABLE_FORMAT:
        raise ValueError(f"table {'.'.join(table.name())} is Iceberg format version {table.format_version}: the "
                         f"catalog commits a backfill makes write format version {WRITABLE_FORMAT} at most (pyiceberg "
                         f"{pyiceberg.__version__}); a table cannot go back a version, so backfill into a v2 table")
    spec = table.spec()
    time_id = table.schema().find_field(time_column).field_id
    others = [f for f in spec.fields if f.source_id != time_id and not isinstance(f.transform, VoidTransform)]
    if others:
        names = ", ".join(f"{f.transform}({table.schema().find_column_name(f.source_id)})" for f in others)
        raise ValueError(f"table {'.'.join(table.name())}: partition spec {spec.spec_id} also partitions by {names}; "
                         f"a backfill writes tables partitioned by the time column '{time_column}' alone "
                         f"(ALTER TABLE ... DROP PARTITION FIELD, or backfill into a table of that shape)")


def _named_columns_exist(table: IcebergTable, named: dict[str, tuple[str, ...]]) -> None:
    """The contract names its columns in table properties, which another engine's rename or drop leaves as they
    were: names the schema lacks are refused here, every property that holds one named, rather than wherever a
    step looks a column up."""
    columns = {f.name for f in table.schema().fields}
    stale = {prop: [n for n in names if n not in columns] for prop, names in named.items()}
    stale = {prop: names for prop, names in stale.items() if names}
    if stale:
        listed = "; ".join(f"'{prop}' names {', '.join(repr(n) for n in names)}" for prop, names in stale.items())
        raise ValueError(f"table {'.'.join(table.name())}: {listed}, which the table's schema does not have (renamed "
                         f"or dropped since?): set the propert{'ies' if len(stale) > 1 else 'y'} to the columns' names "
                         f"now (ALTER TABLE ... SET TBLPROPERTIES ('{next(iter(stale))}' = '...'))")


def transform_name(transform: Any) -> str | None:
    """The time granularity (hour, day, month, year) a partition field's transform cuts by; None for any other."""
    return next((name for name, kind in TRANSFORM_CLASSES.items() if isinstance(transform, kind)), None)


def _spec_transform(table: IcebergTable, spec_id: int, time_column: str) -> str:
    source_id = table.schema().find_field(time_column).field_id
    for field in table.specs()[spec_id].fields:
        if field.source_id == source_id and (name := transform_name(field.transform)) is not None:
            return name
    raise ValueError(
        f"table {'.'.join(table.name())}: partition spec {spec_id} has no hour/day/month/year transform of "
        f"the time column '{time_column}', which the backfill needs to cut work units"
    )


def _first_numeric(schema: pa.Schema, exclude: set[str]) -> str | None:
    for field in schema:
        if field.name not in exclude and (pa.types.is_floating(field.type) or pa.types.is_integer(field.type)):
            return field.name
    return None


def normalize_tiers(partition_by: str | dict[str | None, str]) -> list[tuple[str | None, str]]:
    """``"day"`` or ``{"P90D": "day", "P2Y": "month", None: "year"}`` → youngest-first tiers, checked."""
    if isinstance(partition_by, str):
        items: list[tuple[str | None, str]] = [(None, partition_by)]
    else:
        items = sorted(partition_by.items(), key=lambda kv: (kv[0] is None, _age_days(kv[0])))
    for (age, transform), nxt in zip(items, items[1:] + [None], strict=True):
        if transform not in TRANSFORM_CLASSES:
            raise ValueError(f"partition_by: unknown granularity '{transform}' (one of {', '.join(TRANSFORM_CLASSES)})")
        if nxt is not None and _ORDER.index(nxt[1]) <= _ORDER.index(transform):
            raise ValueError("partition_by: older tiers must be coarser than younger ones (e.g. day, then month, then year)")
        if nxt is None and age is not None:
            raise ValueError("partition_by: the oldest tier must have no age limit (key None)")
        if nxt is not None and age is None:
            raise ValueError("partition_by: only the oldest tier may have no age limit")
    return items


def _age_days(age: str | None) -> float:
    if age is None:
        return float("inf")
    parts = parse_duration(age)
    return parts.get("years", 0) * 365.25 + parts.get("months", 0) * 30.44 + parts.get("weeks", 0) * 7 + parts.get("days", 0) + parts.get("hours", 0) / 24
