"""The table's Parquet write properties, as Iceberg names them and with Iceberg's defaults.

A table tuned for its readers (the page size a query engine's page index skips by, a codec and its level,
dictionaries, bloom filters on the columns queries look up) keeps that tuning in the files a backfill writes,
as it does in files Spark or pyiceberg write. Values are checked when a job loads the table, so a misspelt one
stops the job before it writes anything, with the property named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

CODEC = "write.parquet.compression-codec"
LEVEL = "write.parquet.compression-level"
PAGE_BYTES = "write.parquet.page-size-bytes"
PAGE_ROWS = "write.parquet.page-row-limit"
DICTIONARY_BYTES = "write.parquet.dict-size-bytes"
GROUP_BYTES = "write.parquet.row-group-size-bytes"
GROUP_ROWS = "write.parquet.row-group-limit"  # pyiceberg's; Iceberg Java sizes row groups in bytes alone
BLOOM_BYTES = "write.parquet.bloom-filter-max-bytes"
BLOOM_ENABLED = "write.parquet.bloom-filter-enabled.column."
BLOOM_FPP = "write.parquet.bloom-filter-fpp.column."
BLOOM_NDV = "write.parquet.bloom-filter-ndv.column."

# Iceberg's codec names and pyarrow's for them; Iceberg's lzo has no pyarrow writer.
CODECS = {"zstd": "zstd", "snappy": "snappy", "gzip": "gzip", "lz4": "lz4", "brotli": "brotli", "uncompressed": "none"}
MiB = 1 << 20


@dataclass(frozen=True)
class Bloom:
    """A bloom filter on one column: its false-positive probability and, when the table gives one, the number of
    distinct values a row group holds (the filter is sized from it)."""

    column: str
    fpp: float = 0.01
    ndv: int | None = None


@dataclass(frozen=True)
class ParquetSettings:
    """How every file of the table is written; part of the table's `Contract`, so the scan's sizing sample, the
    writers and publish's rewrites all read the same values, once a job."""

    codec: str = "zstd"
    level: int | None = None
    page_bytes: int = MiB
    page_rows: int = 20_000
    dictionary_bytes: int = 2 * MiB
    group_bytes: int = 128 * MiB
    group_rows: int = MiB
    blooms: tuple[Bloom, ...] = ()
    bloom_bytes: int = MiB

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> ParquetSettings:
        codec = props.get(CODEC, "zstd").strip().lower()
        if codec not in CODECS:
            raise ValueError(f"table property {CODEC}={props[CODEC]!r}: the Parquet writer takes "
                             f"{', '.join(sorted(CODECS))}")
        level = _number(props, LEVEL, None, minimum=None)
        if level is not None and not _takes_level(codec):
            level = None  # Iceberg's writers ignore a level for a codec without levels (snappy) as well
        elif level is not None:
            low, high = pa.Codec.minimum_compression_level(codec), pa.Codec.maximum_compression_level(codec)
            if not low <= level <= high:
                raise ValueError(f"table property {LEVEL}={level}: {codec} takes levels {low} to {high}")
        named = sorted({k.removeprefix(prefix) for k in props for prefix in (BLOOM_ENABLED, BLOOM_FPP, BLOOM_NDV)
                        if k.startswith(prefix)})
        checked = [(Bloom(c, _fraction(props, BLOOM_FPP + c), _number(props, BLOOM_NDV + c, None)),
                    _flag(props, BLOOM_ENABLED + c)) for c in named]  # a filter's settings are checked, on or off
        blooms = tuple(bloom for bloom, enabled in checked if enabled)
        return cls(codec=codec, level=level,
                   page_bytes=_number(props, PAGE_BYTES, cls.page_bytes),
                   page_rows=_number(props, PAGE_ROWS, cls.page_rows),
                   dictionary_bytes=_number(props, DICTIONARY_BYTES, cls.dictionary_bytes),
                   group_bytes=_number(props, GROUP_BYTES, cls.group_bytes),
                   group_rows=_number(props, GROUP_ROWS, cls.group_rows),
                   blooms=blooms, bloom_bytes=_number(props, BLOOM_BYTES, cls.bloom_bytes))

    def writer_options(self, rows: pa.Table) -> dict[str, Any]:
        """pyarrow's `ParquetWriter` options for a file of ``rows`` (or of some of them, in some order).
        A bloom filter without the table's count of distinct values is sized for the distinct values of the
        column in the file, which keeps the probability asked for in every group; Iceberg Java's writer takes
        ``bloom_bytes`` then, so a series column of a few values got a filter of 1 MB a row group. Within
        ``bloom_bytes`` either way. A bloom filter on a column the file lacks (one dropped since) is not written.
        Every file carries a page index (each page's bounds and place), as Iceberg Java's writer's files do: readers
        that have one skip pages within a row group of a time range or a series, at no measurable cost to write."""
        blooms = {b.column: {"fpp": b.fpp, "ndv": min(b.ndv or _distinct(rows, b.column, self.group_rows), self._bloom_ndv_cap(b.fpp))}
                  for b in self.blooms if b.column in rows.schema.names}
        return {"compression": CODECS[self.codec], "compression_level": self.level, "data_page_size": self.page_bytes,
                "max_rows_per_page": self.page_rows, "dictionary_pagesize_limit": self.dictionary_bytes,
                "bloom_filter_options": blooms or None, "write_page_index": True}

    def first_group_rows(self, rows: pa.Table) -> int:
        """Rows of a file's first row group: within the row limit, and within the byte limit counted on the rows in
        memory, which encoded and compressed take no more; later groups are sized on the bytes written so far."""
        per_row = rows.nbytes / rows.num_rows if rows.num_rows else 1.0
        return max(1, min(self.group_rows, int(self.group_bytes / max(per_row, 1e-9))))

    def next_group_rows(self, rows_written: int, bytes_written: int) -> int:
        """Rows of the next row group, from the Parquet bytes the groups before took a row; as Iceberg Java's
        writer does, which checks its buffered bytes against the limit and closes the group when it is reached."""
        if bytes_written <= 0:
            return self.group_rows
        return max(1, min(self.group_rows, int(self.group_bytes * rows_written / bytes_written)))

    def _bloom_ndv_cap(self, fpp: float) -> int:
        """The most distinct values a filter of at most ``bloom_bytes`` holds at ``fpp``. Parquet's split-block
        filters take -8 n / ln(1 - fpp^(1/8)) bits for n values, rounded up to a power of two bytes."""
        bits = 8 * (1 << max(5, self.bloom_bytes.bit_length() - 1))  # a power of two bytes, 32 at least
        return max(1, int(bits * -math.log(1 - fpp ** (1 / 8)) / 8))


def _distinct(rows: pa.Table, column: str, at_most: int) -> int:
    """Distinct values of ``column`` (for a dictionary column, at most its dictionaries' values), at most ``at_most``
    (a row group's rows) and the rows."""
    values = rows.column(column)
    if pa.types.is_dictionary(values.type):
        counted = sum(len(chunk.dictionary) for chunk in values.chunks)
    else:
        counted = pc.count_distinct(values).as_py()
    return max(1, min(at_most, rows.num_rows, counted))


def _takes_level(codec: str) -> bool:
    return codec != "uncompressed" and pa.Codec.supports_compression_level(CODECS[codec])


def _number(props: Mapping[str, str], key: str, default: int | None, minimum: int | None = 1) -> Any:
    if key not in props:
        return default
    try:
        value = int(props[key])
    except ValueError:
        raise ValueError(f"table property {key}={props[key]!r}: not a whole number") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"table property {key}={value}: must be at least {minimum}")
    return value


def _fraction(props: Mapping[str, str], key: str) -> float:
    if key not in props:
        return Bloom.fpp
    try:
        value = float(props[key])
    except ValueError:
        value = math.nan
    if not 0.0 < value < 1.0:
        raise ValueError(f"table property {key}={props[key]!r}: a probability between 0 and 1 (exclusive)")
    return value


def _flag(props: Mapping[str, str], key: str) -> bool:
    value = props.get(key, "false").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"table property {key}={props[key]!r}: true or false")
    return value == "true"
