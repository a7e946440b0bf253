"""Coverage: which history a table holds, bucket by bucket, how complete it is, and who wrote it.

A reader's query can succeed and still be silently incomplete; this module tells which buckets are
``complete``, ``partial``, under an unpublished backfill (``backfilling``) or empty (``gap``), and,
where the table does not say how many rows a bucket should hold, only that it ``has_data``.

Everything comes from Iceberg METADATA: each manifest entry already holds its file's partition,
record count and time-column bounds, and the id of the snapshot that added it (whose summary names
the backfill job, see `publish`). A 3-year table with 20,000 files thus costs a manifest read, not
a table scan. A file whose time bounds fall inside one bucket is counted exactly (every file the
engine or a partitioned live append writes lies in one partition, so buckets at or above the
partition grain are exact); a file spanning several buckets (hour buckets over day partitions, day
buckets over month-tier partitions) is spread evenly over its time span and those buckets are
flagged ``estimated``. Delete files are not subtracted (the engine writes none).

Expected rows need a declared cadence: table property ``timelake.expected-interval`` (a fixed
ISO-8601 duration such as ``PT1M``) times the series count. The series count is the property
``timelake.expected-series`` when set, because only the contract knows series that have never
reported; otherwise, with ``series=True``, the distinct series seen in the range (read from the
series-key column alone). Without a cadence or a series count a bucket with rows ``has_data`` and
``expected`` is None: a day 30 % short looks like any other, so calling it complete would be a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestFile
from pyiceberg.table import Table as IcebergTable

from timelake.model.commit import JOB_PROPERTY, STEP_PROPERTY
from timelake.model.contract import TRANSFORM_CLASSES, Contract, _spec_transform
from timelake.model.layout import file_bounds, int_from_bytes
from timelake.model.timeutil import (
    US_PER_DAY, US_PER_HOUR, floor_to, iso, next_boundary, parse_duration, parse_instant, to_micros, transform_range,
)
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime

EXPECTED_INTERVAL = "timelake.expected-interval"
EXPECTED_SERIES = "timelake.expected-series"
STATUSES = ("complete", "partial", "has_data", "backfilling", "gap")
GRAINS = ("hour", "day", "month")
MAX_BUCKETS = 100_000
LIVE = "live"
FIXED = {"hour": US_PER_HOUR, "day": US_PER_DAY}
_LABELS = {"hour": "%Y-%m-%dT%H", "day": "%Y-%m-%d", "month": "%Y-%m", "year": "%Y"}


@dataclass
class Bucket:
    start: int
    end: int
    grain: str
    rows: int = 0
    files: int = 0
    expected: int | None = None
    status: str = "gap"
    writers: dict[str, int] = field(default_factory=dict)
    last_writer: str | None = None
    backfill_jobs: list[str] = field(default_factory=list)
    estimated: bool = False
    series: dict[str, int] | None = None

    @property
    def label(self) -> str:
        return datetime.fromtimestamp(self.start / 1e6, UTC).strftime(_LABELS[self.grain])

    def to_dict(self) -> dict[str, Any]:
        result = {"bucket": self.label, "start": iso(self.start), "end": iso(self.end), "rows": self.rows,
                  "files": self.files, "expected": self.expected, "status": self.status, "writers": self.writers,
                  "last_writer": self.last_writer, "backfill_jobs": self.backfill_jobs, "estimated": self.estimated}
        if self.series is not None:
            result["series"] = self.series
        return result


@dataclass
class CoverageMap:
    table: str
    by: str
    start: int | None
    end: int | None
    buckets: list[Bucket]
    expected_interval: str | None
    expected_series: int | None
    series_source: str | None  # "property", "seen" or None (no series count)

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for b in self.buckets if b.status == s) for s in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "by": self.by, "start": iso(self.start), "end": iso(self.end),
                "expected_interval": self.expected_interval, "expected_series": self.expected_series,
                "series_source": self.series_source, "rows": sum(b.rows for b in self.buckets),
                "statuses": self.counts(), "buckets": [b.to_dict() for b in self.buckets]}


@dataclass
class FileStats:
    """The live data files of main as columns (one entry per file), read from manifests only."""

    paths: list[str]
    lo: np.ndarray
    hi: np.ndarray  # inclusive upper bound of the time column
    rows: np.ndarray
    seq: np.ndarray
    writer: np.ndarray  # index into ``writers``
    writers: list[str]


def compute(
    rt: Runtime, table_name: str, start: str | datetime | int | None = None, end: str | datetime | int | None = None,
    by: str = "day", series: bool = False, now: datetime | None = None, known: dict[str, list[DataFile]] | None = None,
) -> CoverageMap:
    """Coverage of ``table_name``'s main in [start, end) per ``by`` bucket (hour, day, month, or
    ``partition``: the table's own partitions, tier by tier). Open range ends come from the files' bounds.
    ``known``: manifests whose files the caller holds (see `file_stats`)."""
    if by not in (*GRAINS, "partition"):
        raise ValueError(f"--by '{by}' is not one of {', '.join(GRAINS)}")
    table = rt.load_table(table_name)
    contract = Contract.from_table(table)
    name = ".".join(table.name()[-2:])
    now_us = to_micros(now or datetime.now(UTC))
    lo, hi = _micros(start), _micros(end)
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(f"coverage of {name}: --start {iso(lo)} is not before --end {iso(hi)}")
    grain_at = _grain_at(contract, now_us, by)
    uniform = by if by != "partition" else contract.tiers[0].transform if len(contract.tiers) == 1 else None
    # whole buckets only: a bucket cut by the range would count some of its files and not others
    lo = floor_to(lo, grain_at(lo)) if lo is not None else None
    hi = _ceil(hi, grain_at) if hi is not None else None
    stats = file_stats(rt, table, contract, lo, hi, known)
    if lo is None or hi is None:
        if not len(stats.rows):
            return _empty(name, by, table)
        lo = lo if lo is not None else floor_to(int(stats.lo.min()), grain_at(int(stats.lo.min())))
        hi = hi if hi is not None else _ceil(int(stats.hi.max()) + 1, grain_at)
    edges = bucket_edges(lo, hi, grain_at, by, uniform)
    buckets = [Bucket(a, b, grain_at(a)) for a, b in pairwise(edges)]
    interval = fixed_interval(table.properties[EXPECTED_INTERVAL]) if table.properties.get(EXPECTED_INTERVAL) else None
    fractions = _assign(stats, np.array(edges, dtype=np.int64), buckets, interval)
    counts = _series_counts(stats, contract, fractions, table.io, objects=rt.objects) if series else None
    series_count, source = _series_count(table, contract, interval, counts)
    leases = rt.store.leases(name)
    for k, b in enumerate(buckets):
        if counts is not None:
            b.series = counts.get(k, {})
        b.expected = _expected(b, interval, series_count, edges[0], edges[-1], now_us)
        b.backfill_jobs = sorted({lease.job_id for lease in leases if lease.start < b.end and lease.end > b.start})
        b.status = _status(b)
    return CoverageMap(name, by, edges[0], edges[-1], buckets, table.properties.get(EXPECTED_INTERVAL),
                       series_count, source)


def _ceil(t: int, grain_at: Any) -> int:
    """The first bucket boundary at or after ``t``."""
    start = floor_to(t, grain_at(t))
    return t if start == t else next_boundary(start, grain_at(start))


def _micros(value: str | datetime | int | None) -> int | None:
    """UTC µs of user input (ISO text, datetime) or of an engine instant (already µs)."""
    if value is None or isinstance(value, int):
        return value
    return to_micros(parse_instant(value))


def file_stats(rt: Runtime, table: IcebergTable, contract: Contract, lo: int | None, hi: int | None,
               known: dict[str, list[DataFile]] | None = None) -> FileStats:
    """Per data file of main: time bounds, record count, sequence number and writer, from manifests.

    Manifests whose partition summary lies outside [lo, hi) are not opened; the rest are read in
    parallel (each is one small Avro file). ``known``: manifest path -> the files it holds, for
    manifests a commit just wrote with only ADDED entries that inherit their snapshot id and
    sequence number from main's manifest list: those are not decoded again (publish passes the
    10,000 entries it committed)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        none = np.zeros(0, dtype=np.int64)  # one empty array for the five columns: there is nothing to change in it
        return FileStats(paths=[], lo=none, hi=none, rows=none, seq=none, writer=none, writers=[LIVE])
    time_field = table.schema().find_field(contract.time_column)
    manifests = [m for m in snapshot.manifests(table.io)
                 if m.content == ManifestContent.DATA and _may_overlap(table, contract, m, lo, hi)]

    def read(manifest: ManifestFile) -> list[tuple[str, int, int, int, int, int]]:
        index, transform, _ = _time_partition(table, contract, manifest.partition_spec_id)
        held = (known or {}).get(manifest.manifest_path)
        entries = ((e.data_file, e.sequence_number, e.snapshot_id) for e in manifest.fetch_manifest_entry(
            table.io, discard_deleted=True)) if held is None else (
            (f, manifest.sequence_number, manifest.added_snapshot_id) for f in held)
        found = []
        for f, sequence_number, snapshot_id in entries:
            if f.content != DataFileContent.DATA or not f.record_count:
                continue
            a, b = file_bounds(f, time_field)
            if a is None or b is None:
                a, b = transform_range(transform, f.partition[index])
                b -= 1
            if (lo is not None and b < lo) or (hi is not None and a >= hi):
                continue
            found.append((f.file_path, a, b, f.record_count, sequence_number or 0, snapshot_id or 0))
        return found

    with ThreadPoolExecutor(max_workers=8) as pool:
        entries = [e for part in pool.map(read, manifests) for e in part]
    writers = _writers_by_snapshot(rt, table, {e[5] for e in entries})
    names = [LIVE, *sorted(set(writers.values()))]
    code = {n: i for i, n in enumerate(names)}
    columns: list[Sequence[Any]] = list(zip(*entries, strict=True)) if entries else [[] for _ in range(6)]
    return FileStats(
        paths=list(columns[0]), lo=np.array(columns[1], dtype=np.int64), hi=np.array(columns[2], dtype=np.int64),
        rows=np.array(columns[3], dtype=np.int64), seq=np.array(columns[4], dtype=np.int64),
        writer=np.array([code[writers.get(s, LIVE)] for s in columns[5]], dtype=np.int64), writers=names,
    )


def bucket_edges(lo: int, hi: int, grain_at: Any, by: str, uniform: str | None = None) -> list[int]:
    """Bucket boundaries from ``lo`` (a bucket start) until past ``hi``; ``grain_at(t)`` names the grain at t,
    ``uniform`` the grain everywhere when there is one (``by``, or a table's only partition tier)."""
    if uniform in FIXED:  # a 3-year hour map has 26k buckets: no per-bucket calendar arithmetic
        count = -(-(hi - lo) // FIXED[uniform])
        if count > MAX_BUCKETS:
            raise _too_many(count, lo, hi, by)
        return list(range(lo, hi + FIXED[uniform], FIXED[uniform]))[: count + 1]
    edges = [lo]
    while edges[-1] < hi:
        if len(edges) > MAX_BUCKETS:
            raise _too_many(None, lo, hi, by)
        edges.append(next_boundary(edges[-1], grain_at(edges[-1])))
    return edges


def _too_many(count: int | None, lo: int, hi: int, by: str) -> ValueError:
    """A map is for a person to read, and its size is bounded so that no range can exhaust memory."""
    many = f"{count:,}" if count is not None else f"over {MAX_BUCKETS:,}"
    return ValueError(f"coverage {iso(lo)} … {iso(hi)} by {by} is {many} buckets, at most {MAX_BUCKETS:,}: "
                      "use a coarser --by (day or month) or a narrower --start/--end")


def _grain_at(contract: Contract, now_us: int, by: str) -> Any:
    """The bucket grain at an instant: ``by`` itself, or for ``partition`` the tier that holds it."""
    if by != "partition":
        return lambda _t: by
    if len(contract.tiers) == 1:
        return lambda _t: contract.tiers[0].transform
    cutoffs = contract.tier_cutoffs(datetime.fromtimestamp(now_us / 1e6, UTC))
    return lambda t: contract.tiers[int(contract.tier_index(np.array([t]), cutoffs)[0])].transform


def _writers_by_snapshot(rt: Runtime, table: IcebergTable, wanted: set[int]) -> dict[int, str]:
    """Snapshot id → backfill job id, from the publish commits' summaries; for snapshots since expired
    (and only then: it is a table read) from the provenance records in ``timelake.backfills``.
    Any other snapshot is the live path."""
    from timelake.followup.provenance import history

    writers = {s.snapshot_id: job for s in table.snapshots()
               if s.summary is not None and (job := s.summary.get(JOB_PROPERTY)) and s.summary.get(STEP_PROPERTY) == "publish"}
    if wanted <= {s.snapshot_id for s in table.snapshots()}:
        return writers
    published = history(rt, ".".join(table.name()[-2:]))
    for job_id, ids in zip(published.column("job_id").to_pylist(), published.column("snapshot_ids").to_pylist(), strict=True):
        for snapshot_id in ids or []:
            writers.setdefault(snapshot_id, job_id)
    return writers


def _may_overlap(table: IcebergTable, contract: Contract, manifest: ManifestFile, lo: int | None, hi: int | None) -> bool:
    """From the manifest list's partition summary: can this manifest hold files in [lo, hi)?"""
    if (lo is None and hi is None) or not manifest.partitions:
        return True
    index, transform, result_type = _time_partition(table, contract, manifest.partition_spec_id)
    summary = manifest.partitions[index]
    if summary.lower_bound is None or summary.upper_bound is None:
        return True
    first = transform_range(transform, int_from_bytes(result_type, summary.lower_bound))[0]
    last = transform_range(transform, int_from_bytes(result_type, summary.upper_bound))[1]
    return (hi is None or first < hi) and (lo is None or last > lo)


def _time_partition(table: IcebergTable, contract: Contract, spec_id: int) -> tuple[int, str, Any]:
    """Where a spec keeps the time column's partition value: (field index, transform name, value type).
    An evolved spec may still list a removed time field as a void transform; that one is skipped."""
    transform = _spec_transform(table, spec_id, contract.time_column)
    time_field = table.schema().find_field(contract.time_column)
    for i, f in enumerate(table.specs()[spec_id].fields):
        if f.source_id == time_field.field_id and isinstance(f.transform, TRANSFORM_CLASSES[transform]):
            return i, transform, f.transform.result_type(time_field.field_type)
    raise AssertionError("unreachable: _spec_transform found the field")


def _assign(
    stats: FileStats, edges: np.ndarray, buckets: list[Bucket], interval: int | None,
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Add every file's rows to its bucket(s); returns per file (index, bucket indices, rows per bucket)."""
    n = len(buckets)
    first = np.searchsorted(edges, stats.lo, side="right") - 1
    last = np.searchsorted(edges, stats.hi, side="right") - 1
    inside = (first == last) & (first >= 0) & (first < n)
    rows = np.zeros(n, dtype=np.int64)
    files = np.zeros(n, dtype=np.int64)
    width = len(stats.writers)
    by_writer: np.ndarray = np.zeros(n * width, dtype=np.int64)  # reshaped to (bucket, writer) below
    last_seq = np.full(n, -1, dtype=np.int64)
    last_writer = np.full(n, -1, dtype=np.int64)
    if inside.any():
        idx = first[inside]
        rows += np.bincount(idx, weights=stats.rows[inside], minlength=n).astype(np.int64)
        files += np.bincount(idx, minlength=n)
        by_writer += np.bincount(idx * width + stats.writer[inside], weights=stats.rows[inside], minlength=n * width).astype(np.int64)
        order = np.lexsort((stats.seq[inside], idx))  # by bucket, then sequence: the last of each bucket wins
        sorted_idx = idx[order]
        tail = np.flatnonzero(np.r_[sorted_idx[1:] != sorted_idx[:-1], True])
        last_seq[sorted_idx[tail]] = stats.seq[inside][order][tail]
        last_writer[sorted_idx[tail]] = stats.writer[inside][order][tail]
    by_writer = by_writer.reshape(n, width)
    spread: list[tuple[int, np.ndarray, np.ndarray]] = []
    estimated = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(~inside & (last >= 0) & (first < n)):
        span = np.arange(max(int(first[i]), 0), min(int(last[i]), n - 1) + 1)
        share = _spread(int(stats.rows[i]), int(stats.lo[i]), int(stats.hi[i]), edges[span], edges[span + 1], interval)
        spread.append((int(i), span, share))
        rows[span] += share
        files[span] += 1
        by_writer[span, stats.writer[i]] += share
        estimated[span] = True
        newer = stats.seq[i] >= last_seq[span]
        last_seq[span[newer]] = stats.seq[i]
        last_writer[span[newer]] = stats.writer[i]
    writers: list[dict[str, int]] = [{} for _ in buckets]
    ks, ws = np.nonzero(by_writer)  # row-major: per bucket, writers in their order
    for k, w, n in zip(ks.tolist(), ws.tolist(), by_writer[ks, ws].tolist(), strict=True):
        writers[k][stats.writers[w]] = n
    names = [None, *stats.writers]  # last_writer -1: none
    for bucket, n, f, e, w, last in zip(buckets, rows.tolist(), files.tolist(), estimated.tolist(), writers,
                                        (last_writer + 1).tolist(), strict=True):
        bucket.rows, bucket.files, bucket.estimated, bucket.writers, bucket.last_writer = n, f, e, w, names[last]
    exact = np.flatnonzero(inside)
    return [(int(i), first[i:i + 1], stats.rows[i:i + 1]) for i in exact] + spread


def _spread(total: int, lo: int, hi: int, starts: np.ndarray, ends: np.ndarray, interval: int | None) -> np.ndarray:
    """Rows of a file spanning several buckets, spread evenly over its time span.

    With a declared cadence the last row stands for one more interval ([lo, hi + interval)), which
    is exact for regular data of any number of series; without one the rows are taken as evenly
    spaced points from the lower to the upper bound (exact for one regular series)."""
    if interval:
        overlap = np.clip(np.minimum(ends, hi + interval) - np.maximum(starts, lo), 0, None)
        return _split(total, overlap / (hi + interval - lo))
    if total == 1 or hi == lo:
        return np.where((starts <= lo) & (ends > lo), total, 0)
    step = (hi - lo) / (total - 1)
    before = lambda t: np.clip(np.ceil((t - lo) / step), 0, total).astype(np.int64)  # noqa: E731 (rows strictly before t)
    return before(ends) - before(starts)


def _split(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split by ``weights`` (summing to ≤ 1) into integers that add up exactly (cumulative rounding)."""
    cumulative = np.round(np.cumsum(weights) * total).astype(np.int64)
    return np.diff(np.r_[0, cumulative])


def _series_counts(
    stats: FileStats, contract: Contract, fractions: Sequence[tuple[int, np.ndarray, np.ndarray]], io: Any, *,
    objects: ObjectIO,
) -> dict[int, dict[str, int]]:
    """Rows per series per bucket, reading ONLY the series-key column(s) of the files in range."""
    if not contract.series_key:
        raise ValueError("--series: the table declares no series key (property timelake.series-key)")

    def read(item: tuple[int, np.ndarray, np.ndarray]) -> list[tuple[int, str, int]]:
        i, span, share = item
        fs, path = objects.filesystem(stats.paths[i], io)
        with fs.open_input_file(path) as handle:
            keys = pq.read_table(handle, columns=list(contract.series_key))
        labels = _series_labels(keys, contract.series_key)
        counts = labels.value_counts()
        names, numbers = counts.field("values").to_pylist(), counts.field("counts").to_numpy()
        found = []
        for bucket, part in zip(span, share, strict=True):
            for name, count in zip(names, _split(int(part), numbers / max(numbers.sum(), 1)), strict=True):
                if count:
                    found.append((int(bucket), name, int(count)))
        return found

    result: dict[int, dict[str, int]] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        for found in pool.map(read, fractions):
            for bucket, name, count in found:
                result.setdefault(bucket, {}).setdefault(name, 0)
                result[bucket][name] += count
    return result


def _series_labels(keys: pa.Table, series_key: tuple[str, ...]) -> pa.Array:
    import pyarrow.compute as pc

    columns = [pc.cast(keys.column(k), pa.string()).combine_chunks() for k in series_key]
    return columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, "/")


def _series_count(
    table: IcebergTable, contract: Contract, interval: int | None, counts: dict[int, dict[str, int]] | None,
) -> tuple[int | None, str | None]:
    """(series count, where it came from: ``property`` or ``seen``); None when unknown."""
    declared = table.properties.get(EXPECTED_SERIES)
    if declared:
        try:
            return int(declared), "property"
        except ValueError:
            raise ValueError(f"table property {EXPECTED_SERIES} is '{declared}', not a whole number") from None
    if counts is not None:
        return len({name for per in counts.values() for name in per}), "seen"
    if interval is not None and not contract.series_key:
        return 1, "property"
    return None, None


def fixed_interval(text: str) -> int:
    """The cadence ``text`` (an ISO-8601 duration of fixed length) in microseconds."""
    parts = parse_duration(text)
    if parts.get("years") or parts.get("months"):
        raise ValueError(f"table property {EXPECTED_INTERVAL} is '{text}': the cadence must be a fixed duration (e.g. PT1M, PT1H, P1D)")
    seconds = (((parts.get("weeks", 0) * 7 + parts.get("days", 0)) * 24 + parts.get("hours", 0)) * 60
               + parts.get("minutes", 0)) * 60 + parts.get("seconds", 0)
    return seconds * 1_000_000


def _expected(b: Bucket, interval: int | None, series: int | None, lo: int, hi: int, now_us: int) -> int | None:
    """Cadence slots (multiples of the interval since the epoch) in the bucket, within the range and
    before now (the current bucket is still filling), times the series count."""
    if interval is None or series is None:
        return None
    a, z = max(b.start, lo), min(b.end, hi, now_us)
    if z <= a:
        return 0
    return (-(-z // interval) - -(-a // interval)) * series


def _status(b: Bucket) -> str:
    if b.backfill_jobs:
        return "backfilling"
    if b.rows == 0:
        return "gap"
    if b.expected is None:
        return "has_data"
    return "partial" if b.rows < b.expected else "complete"


def _empty(name: str, by: str, table: IcebergTable) -> CoverageMap:
    return CoverageMap(name, by, None, None, [], table.properties.get(EXPECTED_INTERVAL), None, None)

