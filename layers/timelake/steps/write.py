"""Write one unit: its partition's rows, one series slice, sorted, deduplicated, as ONE Parquet file.

A unit never commits to Iceberg; it writes its file at a deterministic path (a retry overwrites the
same object) and records its counts. The overlap mode is applied here: in merge mode, keys already
on main are dropped and counted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.typedef import Record

from timelake.model.commit import NAN_COUNTS
from timelake.model.contract import Contract
from timelake.model.layout import MainReader, read_range
from timelake.model.spec import JobSpec
from timelake.ports.files import filesystem, make_parent
from timelake.ports.runtime import Runtime
from timelake.ports.store import UnitRecord
from timelake.steps import failures, spill

ROW_GROUP_ROWS = 1 << 20
COMPACT_ROWS = 1 << 20


def write_unit(rt: Runtime, job_id: str, unit_id: str, main: MainReader | None = None) -> dict[str, Any]:
    """Write step. Input: job id and unit id. Output: the unit's counts (also recorded in the store).
    ``main`` is shared by the writers of one process so that merge mode plans main once."""
    try:
        return _write_unit(rt, job_id, unit_id, main)
    except Exception as exc:
        failures.note(rt, job_id, unit_id, exc)
        raise


def _write_unit(rt: Runtime, job_id: str, unit_id: str, main: MainReader | None) -> dict[str, Any]:
    job, unit = rt.store.job_and_unit(job_id, unit_id)
    if unit.status == "done":
        return unit.result
    started = time.monotonic()
    spec = JobSpec.model_validate(job.spec)
    table = rt.load_table(spec.table)
    contract = Contract.from_table(table)
    target = table.schema().as_arrow()
    read = spill.SpillRead()
    rows = _read_slice(unit, target, contract, read)
    order, dup_sum, duplicates, codes = sorted_order(rows, contract)
    conflicts, conflict_sum = 0, 0.0
    if spec.mode == "merge" and len(order) and table.current_snapshot() is not None:
        existing = (main.read(table, unit.info["start"], unit.info["end"]) if main is not None else
                    read_range(table, contract.time_column, unit.info["start"], unit.info["end"], contract.dedup_key))
        if existing.num_rows:
            keyed = rows if codes.packs(contract) else rows.select(list(contract.dedup_key)).take(pa.array(order))
            mask = existing_mask(keyed, existing, contract, codes)
            conflicts, conflict_sum = int(mask.sum()), _sum_at(rows, order[mask], contract)
            order = order[~mask]
    result: dict[str, Any] = {
        "rows_in": rows.num_rows, "rows_written": len(order), "rows_duplicate_in_source": duplicates,
        "rows_conflicting_existing": conflicts, "duplicate_sum": dup_sum, "conflict_sum": conflict_sum,
        "path": None, "bytes": 0, "spec_id": unit.info["spec_id"], "value": unit.info["value"],
        "spill_bytes_read": read.bytes_read,
    }
    if len(order):
        path = unit_path(table, job_id, unit)
        result.update(path=path, bytes=write_parquet(rows, path, table.properties, order))
    result["seconds"] = round(time.monotonic() - started, 3)
    rt.store.complete_unit(job_id, unit_id, result)
    return result


def _read_slice(unit: UnitRecord, target: pa.Schema, contract: Contract, counter: spill.SpillRead) -> pa.Table:
    """The unit's rows, from the byte ranges of its series buckets in its partition's spill files: no
    byte is read for another unit.

    Read batches point into the buffers of whole range reads; every ``COMPACT_ROWS`` rows they are copied
    into compact arrays so those buffers are freed as the read goes on. String series columns are held
    dictionary-encoded (a few thousand series, not millions of strings), so a unit's rows take little more
    memory than their numbers; `write_parquet` casts each row group back to the table's types."""
    series = {name for name in contract.series_key if _is_text(target.field(name).type)}
    pending: list[pa.RecordBatch] = []
    compact: dict[str, list[pa.Array]] = {name: [] for name in target.names}

    def flush() -> None:
        for name in target.names:
            column = pa.concat_arrays([batch.column(name) for batch in pending])
            compact[name].append(pc.dictionary_encode(column) if name in series else column)
        pending.clear()

    for batch in spill.read(unit.info["spill"], unit.info["buckets"], counter):
        pending.append(batch)
        if sum(b.num_rows for b in pending) >= COMPACT_ROWS:
            flush()
    if pending:
        flush()
    if not compact[target.names[0]]:
        return target.empty_table()
    columns = []
    for name in target.names:
        column = pa.chunked_array(compact.pop(name))
        columns.append((column.unify_dictionaries() if name in series else column).combine_chunks())
    fields = [f.with_type(c.type) for f, c in zip(target, columns)]  # keeps the Iceberg field ids
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=target.metadata))


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)


def sort_keys(contract: Contract) -> list[tuple[str, str]]:
    """The table's sort order: series key, time, then any other dedup columns."""
    return [(c, "ascending") for c in contract.sort_columns]


def sorted_order(rows: pa.Table, contract: Contract) -> tuple[np.ndarray, float, int, KeyCodes]:
    """The row numbers of ``rows`` in the table's sort order, keeping the LAST source row of each dedup key
    (later rows in an export are corrections); the duplicates' count and check sum; the kept rows' sort
    codes, which merge mode reuses to find the keys already on main.

    The rows themselves are not reordered: the writer takes them in order one row group at a time, so a
    unit holds its rows once, not twice."""
    keys = sort_key_codes(rows, contract)
    if rows.num_rows == 0:
        return np.empty(0, dtype=np.int64), 0.0, 0, keys
    order = np.lexsort(keys.columns[::-1])  # stable; the first key is the primary one
    columns = keys.columns
    same_as_next = np.ones(rows.num_rows - 1, dtype=bool)
    for i, codes in enumerate(columns):
        columns[i] = codes[order]  # each unordered column is released as its ordered copy is made
        del codes
        same_as_next &= columns[i][:-1] == columns[i][1:]
    duplicates = int(same_as_next.sum())
    if not duplicates:
        return order, 0.0, 0, keys
    drop = np.append(same_as_next, False)
    return order[~drop], _sum_at(rows, order[drop], contract), duplicates, KeyCodes([c[~drop] for c in columns], keys.distinct)


def _sort_and_dedup(rows: pa.Table, contract: Contract) -> tuple[pa.Table, float, int, KeyCodes]:
    """`sorted_order` applied: the kept rows themselves, in order."""
    order, dup_sum, duplicates, codes = sorted_order(rows, contract)
    return rows.take(pa.array(order)), dup_sum, duplicates, codes


@dataclass(frozen=True)
class KeyCodes:
    """Rows' sort-order columns as integer arrays that order like the values (see ``sort_key_codes``).

    A string column is each row's rank among ``distinct[name]``, its sorted distinct values.
    """

    columns: list[np.ndarray]
    distinct: dict[str, pa.Array]

    def packs(self, contract: Contract) -> bool:
        """Whether `existing_mask` answers from these codes alone, without the rows."""
        series = contract.series_key[0] if len(contract.series_key) == 1 else None
        return series in self.distinct and list(contract.dedup_key) == [series, contract.time_column]


def sort_key_codes(rows: pa.Table, contract: Contract) -> KeyCodes:
    """The sort-order columns as integer arrays that order like the values.

    Strings become their rank among the distinct values (a few hundred devices, not millions of rows),
    so the sort compares integers: several times faster than sorting strings row by row.
    """
    codes, distinct = [], {}
    for name, _ in sort_keys(contract):
        column = rows.column(name)
        if pa.types.is_dictionary(column.type):
            dictionary = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            by_value = pc.sort_indices(dictionary.dictionary).to_numpy()
            distinct[name] = dictionary.dictionary.take(pa.array(by_value))
            rank = np.empty(len(by_value), dtype=np.int32)
            rank[by_value] = np.arange(len(by_value), dtype=np.int32)
            codes.append(rank[dictionary.indices.to_numpy(zero_copy_only=False)])
            continue
        if _is_text(column.type):
            distinct[name] = pc.unique(column).sort()
            column = pc.index_in(column, value_set=distinct[name])
        elif pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
            column = pc.cast(column, pa.int64())
        codes.append(_numpy(column))
    return KeyCodes(codes, distinct)


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False) if isinstance(column, pa.Array) else column.combine_chunks().to_numpy(zero_copy_only=False)


def drop_existing(rows: pa.Table, existing: pa.Table, contract: Contract, codes: KeyCodes | None = None) -> tuple[pa.Table, int, float]:
    """Merge mode: existing rows win. Returns the rows left, how many were dropped and their check sum."""
    if rows.num_rows == 0 or existing.num_rows == 0:
        return rows, 0, 0.0
    mask = existing_mask(rows, existing, contract, codes)
    if not mask.any():
        return rows, 0, 0.0
    conflict_sum = _sum(rows.filter(pa.array(mask)), contract)
    return rows.filter(pa.array(~mask)), int(mask.sum()), conflict_sum


def existing_mask(rows: pa.Table, existing: pa.Table, contract: Contract, codes: KeyCodes | None = None) -> np.ndarray:
    """Which of ``rows`` have a key in ``existing``; ``codes`` are the rows' ``sort_key_codes`` if known.

    For the usual key (one series column + time) both sides become one int64 per row (the series'
    rank among the rows' sorted series, then microseconds). Rows in the table's sort order (as units
    and staged files are) then pack to an ascending array, and a binary search of each existing key
    among them answers the membership; otherwise each row is looked up among the sorted existing
    keys. Other keys take Arrow's join.
    """
    keys = list(contract.dedup_key)
    if len(contract.series_key) == 1 and keys == [contract.series_key[0], contract.time_column]:
        series, time_column = contract.series_key[0], contract.time_column
        codes = codes if codes is not None and series in codes.distinct else None
        if codes is None:
            distinct = pc.unique(rows.column(series)).sort()
            ranks = _numpy(pc.fill_null(pc.index_in(rows.column(series), value_set=distinct), len(distinct)))
            mine_times = pc.cast(rows.column(time_column), pa.int64()).to_numpy(zero_copy_only=False)
        else:
            distinct, ranks, mine_times = codes.distinct[series], codes.columns[0], codes.columns[1]
        theirs_ranks = _numpy(pc.fill_null(pc.index_in(existing.column(series), value_set=distinct.cast(existing.schema.field(series).type)),
                                          len(distinct)))  # a series the rows lack gets a rank no row has
        theirs_times = pc.cast(existing.column(time_column), pa.int64()).to_numpy(zero_copy_only=False)
        base = min(int(mine_times.min()), int(theirs_times.min()))
        time_bits = max(max(int(mine_times.max()), int(theirs_times.max())) - base, 1).bit_length()
        if time_bits + len(distinct).bit_length() + 1 <= 63:
            mine = (ranks.astype(np.int64) << time_bits) | (mine_times - base)
            theirs = (theirs_ranks.astype(np.int64) << time_bits) | (theirs_times - base)
            if not bool(np.all(theirs[1:] >= theirs[:-1])):
                theirs = np.sort(theirs)
            if bool(np.all(mine[1:] > mine[:-1])):
                at = np.minimum(np.searchsorted(mine, theirs), len(mine) - 1)
                mask = np.zeros(len(mine), dtype=bool)
                mask[at[mine[at] == theirs]] = True
                return mask
            at = np.minimum(np.searchsorted(theirs, mine), len(theirs) - 1)
            return theirs[at] == mine
    left = rows.select(keys).append_column("__row", pa.array(np.arange(rows.num_rows)))
    hits = left.join(existing.select(keys).cast(left.select(keys).schema), keys=keys, join_type="left semi")
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[hits.column("__row").to_numpy()] = True
    return mask


def _sum(rows: pa.Table, contract: Contract) -> float:
    if not contract.check_column or rows.num_rows == 0:
        return 0.0
    return float(pc.sum(rows.column(contract.check_column)).as_py() or 0)


def _sum_at(rows: pa.Table, at: np.ndarray, contract: Contract) -> float:
    """The check column's sum over the rows numbered ``at``."""
    if not contract.check_column or not len(at):
        return 0.0
    return float(pc.sum(rows.column(contract.check_column).take(pa.array(at))).as_py() or 0)


def unit_path(table: Any, job_id: str, unit: UnitRecord, suffix: str = "") -> str:
    spec = table.specs()[unit.info["spec_id"]]
    partition = spec.partition_to_path(Record(unit.info["value"]), table.schema())
    return f"{table.location().rstrip('/')}/data/{partition}/{job_id}-{unit.unit_id}{suffix}.parquet"


def write_parquet(rows: pa.Table, path: str, properties: dict[str, str], order: np.ndarray | None = None) -> int:
    """Write one file with Iceberg field ids (from the table's Arrow schema); returns its size in bytes.
    With ``order``, the rows numbered so are written in that order, taken one row group at a time.

    Parquet statistics do not count NaNs, which Iceberg's ``nan_value_counts`` wants for float
    columns (engines prune ``x = 'NaN'`` and ``isnan`` with them): they are counted here and kept in
    the footer, where `timelake.model.commit.data_file` reads them with the other statistics."""
    fs, local = filesystem(path)
    make_parent(fs, local)
    codec = properties.get("write.parquet.compression-codec", "zstd")
    count = rows.num_rows if order is None else len(order)
    nans = {}
    for f in rows.schema:
        if pa.types.is_floating(f.type):
            is_nan = pc.fill_null(pc.is_nan(rows.column(f.name)), False).to_numpy(zero_copy_only=False)
            nans[f.name] = int(is_nan.sum() if order is None else is_nan[order].sum())
    fields = [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in rows.schema]
    schema = pa.schema(fields, metadata={**(rows.schema.metadata or {}), NAN_COUNTS: json.dumps(nans).encode()})
    with fs.open_output_stream(local) as out:
        with pq.ParquetWriter(out, schema, compression=None if codec == "uncompressed" else codec) as writer:
            for start in range(0, count, ROW_GROUP_ROWS):
                group = rows.slice(start, ROW_GROUP_ROWS) if order is None else rows.take(pa.array(order[start:start + ROW_GROUP_ROWS]))
                writer.write_table(group.cast(schema), row_group_size=ROW_GROUP_ROWS)
        return out.tell()  # the file's size, without asking the store for it
