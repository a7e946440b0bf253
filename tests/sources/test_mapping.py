"""Mapping raw batches onto the table schema: columns, time zones, DST, epochs, casts and rejected rows."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from timelake.sources.base import SourceBatch, open_source
from timelake.sources.mapping import MappedBatch, Mapper, MappingError, number_hint, timestamp_hint

UTC = UTC
TARGET = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("sensor", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("ok", pa.bool_()),
    ]
)
WITH_UNIT = TARGET.append(pa.field("unit", pa.string(), nullable=False))


def _batch(columns: dict[str, Any], origin: str = "a.csv", row_offset: int = 0) -> SourceBatch:
    return SourceBatch(pa.RecordBatch.from_pydict(columns), origin, row_offset)


def _mapper(schema: pa.Schema, target: pa.Schema = TARGET, **options: Any) -> Mapper:
    return Mapper(target, schema, **{"time_column": "ts", "series_key": ["sensor"], **options})


def _map(columns: dict[str, Any], target: pa.Schema = TARGET, **options: Any) -> MappedBatch:
    batch = _batch(columns)
    return _mapper(batch.data.schema, target, **options).apply(batch)


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def _times(mapped: MappedBatch) -> list[datetime]:
    return mapped.table.column("ts").to_pylist()


def _naive(values: list[str]) -> dict[str, Any]:
    stamps = pa.array([datetime.fromisoformat(v) for v in values], pa.timestamp("us"))
    return {"ts": stamps, "sensor": ["s"] * len(values)}


def test_column_map_renames_fills_and_ignores() -> None:
    columns = {
        "timestamp": pa.array([_utc(2024, 1, 1)], pa.timestamp("us", "UTC")),
        "sensor": ["s1"],
        "reading": ["1.5"],
        "extra": [1],
    }
    batch = _batch(columns)
    mapper = _mapper(batch.data.schema, column_map={"ts": "timestamp", "value": "reading"})
    assert mapper.filled_with_null == ["ok"]
    assert mapper.ignored_source_columns == ["extra"]
    mapped = mapper.apply(batch)
    assert mapped.table.schema.equals(TARGET)
    assert mapped.table.to_pylist() == [{"ts": _utc(2024, 1, 1), "sensor": "s1", "value": 1.5, "ok": None}]
    assert not mapped.rejected


def test_missing_mapped_column_lists_available_columns() -> None:
    schema = pa.schema([("time", pa.string()), ("sensor", pa.string())])
    with pytest.raises(MappingError, match=r"'ts' is mapped to source column 'timestamp'.*columns: time, sensor\)"):
        _mapper(schema, column_map={"ts": "timestamp"})


def test_unknown_table_column_in_map() -> None:
    schema = pa.schema([("ts", pa.string()), ("sensor", pa.string())])
    with pytest.raises(MappingError, match=r"'temperature' is not a column of the table \(table columns: ts, sensor"):
        _mapper(schema, column_map={"temperature": "ts"})


def test_required_columns_missing_from_source() -> None:
    with pytest.raises(MappingError, match=r"column 'sensor' \(source 'sensor'\) is required but missing.*columns: ts"):
        _mapper(pa.schema([("ts", pa.string())]))
    with pytest.raises(MappingError, match=r"column 'ts' \(source 'ts'\) is required but missing"):
        _mapper(pa.schema([("sensor", pa.string())]))
    with pytest.raises(MappingError, match=r"column 'unit' \(source 'unit'\) is required but missing"):
        _mapper(pa.schema([("ts", pa.string()), ("sensor", pa.string())]), WITH_UNIT)


def test_target_time_column_must_be_utc_microseconds() -> None:
    target = pa.schema([("ts", pa.timestamp("ns")), ("sensor", pa.string())])
    with pytest.raises(MappingError, match=r"'ts' is timestamp\[ns\], expected timestamp\[us, tz=UTC\]"):
        _mapper(target, target)


def test_incompatible_type_fails_before_reading() -> None:
    schema = pa.schema([("ts", pa.string()), ("sensor", pa.string()), ("value", pa.list_(pa.int64()))])
    with pytest.raises(MappingError, match=r"column 'value' \(source 'value'\) cannot be converted from list<item"):
        _mapper(schema)


def test_naive_timestamps_need_tz() -> None:
    schema = pa.schema([("timestamp", pa.timestamp("us")), ("sensor", pa.string())])
    message = (
        "column 'ts' (source 'timestamp') holds naive timestamps: "
        "pass tz=... (--tz) to say which local time zone they are in"
    )
    with pytest.raises(MappingError, match=re.escape(message)):
        _mapper(schema, column_map={"ts": "timestamp"})


def test_naive_strings_need_tz_and_name_the_row() -> None:
    with pytest.raises(MappingError, match=r"naive timestamps such as '2024-01-01 00:00:00' at row 2 of a.csv: pass"):
        _map({"ts": ["2024-01-01T00:00:00Z", "2024-01-01 00:00:00"], "sensor": ["s", "s"]})


def test_unknown_tz() -> None:
    with pytest.raises(MappingError, match="unknown time zone 'Mars/Olympus'"):
        _map(_naive(["2024-01-01T00:00"]), tz="Mars/Olympus")


def test_tz_aware_input_is_converted_to_utc_microseconds() -> None:
    new_york = ZoneInfo("America/New_York")
    stamps = pa.array([datetime(2024, 7, 1, 8, 0, tzinfo=new_york)], pa.timestamp("s", "America/New_York"))
    assert _times(_map({"ts": stamps, "sensor": ["s"]})) == [_utc(2024, 7, 1, 12)]
    ns = pa.array([1_700_000_000_123_456_789, -1], pa.int64()).cast(pa.timestamp("ns", "Asia/Kolkata"))
    assert _times(_map({"ts": ns, "sensor": ["s", "s"]})) == [
        _utc(2023, 11, 14, 22, 13, 20, 123456),
        _utc(1969, 12, 31, 23, 59, 59, 999999),
    ]


def test_berlin_local_times_across_both_dst_switches() -> None:
    local = ["2024-03-31T01:59", "2024-03-31T03:00", "2024-10-27T01:30", "2024-10-27T03:30", "2024-07-01T12:00"]
    assert _times(_map(_naive(local), tz="Europe/Berlin")) == [
        _utc(2024, 3, 31, 0, 59),
        _utc(2024, 3, 31, 1, 0),
        _utc(2024, 10, 26, 23, 30),
        _utc(2024, 10, 27, 2, 30),
        _utc(2024, 7, 1, 10, 0),
    ]


@pytest.mark.parametrize("policy", ["refuse", "drop"])
def test_nonexistent_and_ambiguous_times_are_dropped_and_counted(policy: str) -> None:
    local = ["2024-03-31T01:00", "2024-03-31T02:30", "2024-10-27T02:30", "2024-10-27T02:45", "2024-10-27T04:00"]
    mapped = _map(_naive(local), tz="Europe/Berlin", dst_policy=policy)
    assert _times(mapped) == [_utc(2024, 3, 31, 0, 0), _utc(2024, 10, 27, 3, 0)]
    assert mapped.rejected == {"dst_nonexistent": 1, "dst_ambiguous": 2}
    assert mapped.examples["dst_nonexistent"] == "row 2 of a.csv: ts=2024-03-31 02:30:00"
    assert mapped.examples["dst_ambiguous"] == "row 3 of a.csv: ts=2024-10-27 02:30:00"
    assert mapped.table.schema.equals(TARGET)


@pytest.mark.parametrize(
    ("policy", "nonexistent", "ambiguous"),
    [
        ("earliest", _utc(2024, 3, 31, 0, 59, 59, 999999), _utc(2024, 10, 27, 0, 30)),
        ("latest", _utc(2024, 3, 31, 1, 0), _utc(2024, 10, 27, 1, 30)),
    ],
)
def test_dst_policies_resolve(policy: str, nonexistent: datetime, ambiguous: datetime) -> None:
    mapped = _map(_naive(["2024-03-31T02:30", "2024-10-27T02:30"]), tz="Europe/Berlin", dst_policy=policy)
    assert _times(mapped) == [nonexistent, ambiguous]
    assert not mapped.rejected


def test_dst_in_local_strings() -> None:
    strings = ["2024-03-31 02:30:00", "2024-10-27T02:30:00", "2024-10-27T02:30:00+01:00", "2024-10-27"]
    mapped = _map({"ts": strings, "sensor": ["s"] * 4}, tz="Europe/Berlin", dst_policy="drop")
    assert _times(mapped) == [_utc(2024, 10, 27, 1, 30), _utc(2024, 10, 26, 22, 0)]
    assert mapped.rejected == {"dst_nonexistent": 1, "dst_ambiguous": 1}


def test_iso_strings_with_and_without_offsets() -> None:
    strings = [
        "2024-01-01T00:00:00Z",
        "2024-01-01T00:00:00+01:00",
        "2024-01-01T00:00:00.1234567-0530",
        " 2024-06-01T12:00:00 ",
        "2024-06-01",
        "0100-01-01T00:00:00Z",
    ]
    mapped = _map({"ts": strings, "sensor": ["s"] * len(strings)}, tz="Europe/Berlin")
    assert _times(mapped) == [
        _utc(2024, 1, 1),
        _utc(2023, 12, 31, 23),
        _utc(2024, 1, 1, 5, 30, 0, 123456),
        _utc(2024, 6, 1, 10),
        _utc(2024, 5, 31, 22),
        _utc(100, 1, 1),
    ]


def test_offset_strings_need_no_tz() -> None:
    assert _times(_map({"ts": ["2024-01-01T01:00:00+01:00"], "sensor": ["s"]})) == [_utc(2024, 1, 1)]


def test_unparseable_time_names_column_file_row_and_value() -> None:
    times = ["2024-01-01T00:00:00Z", "yesterday-ish", "2024-01-01T00:00:00Z"]
    batch = _batch({"when": times, "sensor": ["s"] * 3}, origin="x.csv", row_offset=1000)
    mapper = _mapper(batch.data.schema, column_map={"ts": "when"}, tz="UTC")
    pattern = r"column 'ts' \(source 'when'\): cannot convert 'yesterday-ish' at row 1002 of x.csv to .*ISO 8601"
    with pytest.raises(MappingError, match=pattern):
        mapper.apply(batch)


@pytest.mark.parametrize(
    ("unit", "value", "micros"),
    [
        ("s", 1_700_000_000, 0),
        ("ms", 1_700_000_000_123, 123_000),
        ("us", 1_700_000_000_123_456, 123_456),
        ("ns", 1_700_000_000_123_456_789, 123_456),
    ],
)
def test_epoch_integers(unit: str, value: int, micros: int) -> None:
    mapped = _map({"ts": pa.array([value], pa.int64()), "sensor": ["s"]}, time_unit=unit)
    assert _times(mapped) == [_utc(2023, 11, 14, 22, 13, 20, micros)]


def test_negative_nanosecond_epoch_floors() -> None:
    mapped = _map({"ts": pa.array([-1500, 1999], pa.int64()), "sensor": ["s", "s"]}, time_unit="ns")
    assert _times(mapped) == [_utc(1969, 12, 31, 23, 59, 59, 999998), _utc(1970, 1, 1, 0, 0, 0, 1)]


def test_epoch_integers_need_time_unit() -> None:
    with pytest.raises(MappingError, match=r"column 'ts' \(source 'ts'\) holds integers: pass time_unit=\.\.\. \("):
        _map({"ts": pa.array([1], pa.int32()), "sensor": ["s"]})


def test_epoch_out_of_range_names_value() -> None:
    with pytest.raises(MappingError, match=r"cannot convert 10000000000000000 at row 2 of a.csv"):
        _map({"ts": pa.array([0, 10**16], pa.int64()), "sensor": ["s", "s"]}, time_unit="s")


def test_uncastable_value_names_column_file_row_and_value() -> None:
    columns = {"ts": ["2024-01-01T00:00:00Z"] * 4, "sensor": ["s", None, "s", "s"], "value": ["1.5", "2", "3", "abc"]}
    batch = _batch(columns, origin="exports/day.csv", row_offset=500)
    pattern = r"column 'value' \(source 'value'\): cannot convert 'abc' at row 504 of exports/day.csv to double"
    with pytest.raises(MappingError, match=pattern):
        _mapper(batch.data.schema).apply(batch)


def test_string_columns_cast_to_target_types() -> None:
    columns = {
        "ts": ["2024-01-01T00:00:00Z"] * 3,
        "sensor": ["a", "b", "c"],
        "value": ["1", "2.5", None],
        "ok": ["true", "0", None],
    }
    mapped = _map(columns)
    assert mapped.table.column("value").to_pylist() == [1.0, 2.5, None]
    assert mapped.table.column("ok").to_pylist() == [True, False, None]


def test_null_time_series_key_and_required_are_counted_once() -> None:
    columns = {
        "ts": ["2024-01-01T00:00:00Z", None, "2024-01-01T00:00:02Z", None, "2024-01-01T00:00:04Z"],
        "sensor": ["s", "s", None, None, "s"],
        "unit": ["C", "C", "C", "C", None],
    }
    mapped = _map(columns, target=WITH_UNIT)
    assert mapped.rejected == {"null_time": 2, "null_series_key": 1, "null_required": 1}
    assert mapped.examples == {
        "null_time": "row 2 of a.csv: ts=null",
        "null_series_key": "row 3 of a.csv: sensor=null",
        "null_required": "row 5 of a.csv: unit=null",
    }
    assert mapped.table.num_rows == 1
    assert mapped.table.schema.equals(WITH_UNIT)


def test_a_null_held_in_a_dictionary_counts_as_a_null_series_key() -> None:
    """A dictionary column's nulls may be values of its dictionary, which its validity bitmap does not
    show (its null count is 0): such a series key is still rejected, and a column with no null at all
    rejects nothing."""
    sensors = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0]), pa.array(["s", None]))
    assert sensors.null_count == 0
    stamps = ["2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z", "2024-01-01T00:00:02Z"]
    mapped = _map({"ts": stamps, "sensor": sensors})
    assert mapped.rejected == {"null_series_key": 1}
    assert mapped.examples == {"null_series_key": "row 2 of a.csv: sensor=null"}
    clean = _map({"ts": stamps, "sensor": pa.DictionaryArray.from_arrays(pa.array([0, 1, 0]), pa.array(["s", "t"]))})
    assert clean.rejected == {} and clean.table.column("sensor").to_pylist() == ["s", "t", "s"]


def test_output_schema_equals_target_for_every_source_format(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("ts,sensor,value,ok\n2024-01-01T00:00:00Z,s,1.5,true\n2024-01-01T00:01:00Z,s,,\n")
    parquet = {"ts": pa.array([0], pa.timestamp("ms", "UTC")), "sensor": ["s"], "value": pa.array([1], pa.int32())}
    pq.write_table(pa.table(parquet), tmp_path / "b.parquet")
    (tmp_path / "c.jsonl").write_text('{"ts": "2024-01-01T00:00:00Z", "sensor": "s", "value": 1, "ok": false}\n')
    for name, rows in [("a.csv", 2), ("b.parquet", 1), ("c.jsonl", 1)]:
        source = open_source(str(tmp_path / name))
        mapper = _mapper(source.schema())
        tables = [mapper.apply(batch).table for batch in source.batches()]
        assert all(t.schema.equals(TARGET) for t in tables)
        assert sum(t.num_rows for t in tables) == rows


def test_each_batch_is_checked_against_its_own_columns() -> None:
    mapper = _mapper(pa.schema([("ts", pa.string()), ("sensor", pa.string())]))
    with pytest.raises(MappingError, match=r"column 'sensor' \(source 'sensor'\) is required but missing from b.jsonl"):
        mapper.apply(_batch({"ts": ["2024-01-01T00:00:00Z"]}, origin="b.jsonl"))
    with pytest.raises(MappingError, match=r"column 'ts' \(source 'ts'\) is double: expected timestamps"):
        mapper.apply(_batch({"ts": [1.5], "sensor": ["s"]}, origin="c.jsonl"))
    later = _batch({"sensor": ["s"], "ts": ["2024-01-01T00:00:00Z"], "ok": ["true"]})
    assert mapper.apply(later).table.column("ok").to_pylist() == [True]


def test_bad_values_null_or_reject_with_up_to_five_examples() -> None:
    columns = {"ts": ["2026-01-01T00:00:00Z"] * 8, "sensor": ["a"] * 8,
               "value": ["1,5", "#ERR", "2", "#ERR", "x", "y", "z", "3,25"]}
    nulled = _map(columns, on_bad_value="null", decimal=",")
    assert nulled.table.column("value").to_pylist() == [1.5, None, 2.0, None, None, None, None, 3.25]
    rejected = _map(columns, on_bad_value="reject", decimal=",")
    assert rejected.table.column("value").to_pylist() == [1.5, 2.0, 3.25]
    assert rejected.rejected == {"bad_value": 5}
    assert rejected.examples["bad_value"].split(" | ") == [
        f"row {i} of a.csv: value={v}" for i, v in [(2, "#ERR"), (4, "#ERR"), (5, "x"), (6, "y"), (7, "z")]]
    with pytest.raises(MappingError, match="'#ERR' at row 2 of a.csv"):
        _map(columns, decimal=",")


def test_dotted_dates_and_strptime_formats_read_as_local_time() -> None:
    dotted = _map({"ts": ["25.10.2026 01:30:00", "01.02.2026 12:00"], "sensor": ["a", "a"]}, tz="Europe/Berlin")
    assert dotted.table.column("ts").to_pylist() == [datetime(2026, 10, 24, 23, 30, tzinfo=UTC),
                                                     datetime(2026, 2, 1, 11, 0, tzinfo=UTC)]
    formatted = _map({"ts": ["10/25/2026 01:30"], "sensor": ["a"]}, tz="Europe/Berlin",
                     timestamp_format="%m/%d/%Y %H:%M")
    assert formatted.table.column("ts").to_pylist() == [datetime(2026, 10, 24, 23, 30, tzinfo=UTC)]
    bad_time = _map({"ts": ["25.10.2026 01:30", "#ERR"], "sensor": ["a", "a"]}, tz="Europe/Berlin",
                    on_bad_value="reject")
    assert bad_time.rejected == {"bad_value": 1} and bad_time.table.num_rows == 1


FALL_BACK = ["2024-10-27T01:30", "2024-10-27T02:00", "2024-10-27T02:30", "2024-10-27T02:00", "2024-10-27T02:30",
             "2024-10-27T03:00"]


def test_infer_takes_each_series_passes_in_source_order() -> None:
    local = [*FALL_BACK, *FALL_BACK[:3]]
    sensors = ["a"] * 6 + ["b"] * 3
    batch = _batch({"ts": pa.array([datetime.fromisoformat(t) for t in local], pa.timestamp("us")),
                    "sensor": sensors})
    mapper = _mapper(batch.data.schema, tz="Europe/Berlin", dst_policy="infer")
    first = mapper.apply(SourceBatch(batch.data.slice(0, 4), "a.csv", 0))
    second = mapper.apply(SourceBatch(batch.data.slice(4), "a.csv", 4))  # a pass continues across batches
    assert _times(first) + _times(second) == [
        _utc(2024, 10, 26, 23, 30), _utc(2024, 10, 27, 0, 0), _utc(2024, 10, 27, 0, 30),
        _utc(2024, 10, 27, 1, 0), _utc(2024, 10, 27, 1, 30), _utc(2024, 10, 27, 2, 0),
        _utc(2024, 10, 26, 23, 30), _utc(2024, 10, 27, 0, 0), _utc(2024, 10, 27, 0, 30),
    ]
    assert not first.rejected and not second.rejected
    assert mapper.undetermined() == ["series sensor=b at 2024-10-27 02:00 local in a.csv"]


def test_earliest_and_latest_count_folded_rows_as_dst_collapsed() -> None:
    for policy, kept in (("earliest", [(26, 23, 30), (27, 0, 0), (27, 0, 30), (27, 2, 0)]),
                         ("latest", [(26, 23, 30), (27, 1, 0), (27, 1, 30), (27, 2, 0)])):
        mapped = _map(_naive(FALL_BACK), tz="Europe/Berlin", dst_policy=policy)
        assert mapped.rejected == {"dst_collapsed": 2}
        assert _times(mapped) == [_utc(2024, 10, d, h, m) for d, h, m in kept]
        assert mapped.examples["dst_collapsed"] == "row 4 of a.csv: ts=2024-10-27 02:00:00"


@pytest.mark.parametrize("values", [["yesterday"], ["2024-01-01 00:00:00", "2024-13-45 99:00"], ["2024-01-01T00:00:00Z", "noon"]])
def test_an_unparseable_time_without_tz_says_so_rather_than_asking_for_tz(values: list[str]) -> None:
    with pytest.raises(MappingError) as raised:
        _map({"ts": values, "sensor": ["s"] * len(values)})
    message = str(raised.value)
    assert f"column 'ts' (source 'ts'): cannot convert {values[-1]!r} at row {len(values)} of a.csv" in message
    assert "not an ISO 8601 date and time" in message and "naive" not in message and "--tz" not in message


@pytest.mark.parametrize(("value", "decimal", "options", "number"), [
    ("1,234.5", ".", {"thousands": ","}, 1234.5), ("1.234,5", ".", {"thousands": ".", "decimal": ","}, 1234.5),
    ("12,5", ".", {"decimal": ","}, 12.5), ("12.345.678", ".", {"thousands": ".", "decimal": ","}, 12345678.0),
    ("1.234", ",", {"thousands": "."}, 1234.0), ("1 234,5", ".", {"thousands": " ", "decimal": ","}, 1234.5),
    ("1'234.5", ".", {"thousands": "'"}, 1234.5)])
def test_a_number_written_another_way_names_the_options_that_read_it(value: str, decimal: str, options: dict,
                                                                     number: float) -> None:
    quoted = {k: '"\'"' if v == "'" else f"'{v}'" for k, v in options.items()}
    assert number_hint(value, decimal, None) == " ".join(f"--{k} {v}" for k, v in quoted.items()) + " reads it"
    read = _map({"ts": ["2026-01-01T00:00:00Z"], "sensor": ["a"], "value": [value]}, **{"decimal": decimal, **options})
    assert read.table.column("value").to_pylist() == [number]


@pytest.mark.parametrize(("text", "fmt"), [
    ("2/26/2026 12:00:00 AM", "%m/%d/%Y %I:%M:%S %p"), ("26-Feb-26 12:00:00", "%d-%b-%y %H:%M:%S"),
    ("2026/02/26 13:00:00", "%Y/%m/%d %H:%M:%S"), ("13/02/2026 10:00:00", "%d/%m/%Y %H:%M:%S")])
def test_a_time_in_a_known_pattern_names_the_format_that_reads_it(text: str, fmt: str) -> None:
    with pytest.raises(MappingError, match=re.escape(f"--timestamp-format '{fmt}' reads it")):
        _map({"ts": [text], "sensor": ["a"]}, tz="UTC")
    assert _times(_map({"ts": [text], "sensor": ["a"]}, tz="UTC", timestamp_format=fmt)) == [
        datetime.strptime(text, fmt).replace(tzinfo=UTC)]
    assert "(or '%d/%m/%Y %H:%M' if the day comes first)" in timestamp_hint("02/03/2026 10:00")


def test_thousands_reads_only_numbers_grouped_in_threes() -> None:
    values = ["1,234.5", "12,345,678", "-1,000", "999.5", "1,2", "12,34"]
    mapped = _map({"ts": ["2026-01-01T00:00:00Z"] * 6, "sensor": ["a"] * 6, "value": values},
                  thousands=",", on_bad_value="null")
    assert mapped.table.column("value").to_pylist() == [1234.5, 12345678.0, -1000.0, 999.5, None, None]
    [entry] = mapped.issues.to_json()
    assert (entry["action"], entry["column"], entry["kind"], entry["rows"]) == ("nulled", "value", "decimal mark", 2)


def test_states_keep_text_that_is_no_number_and_count_it() -> None:
    target = TARGET.append(pa.field("state", pa.string()))
    columns = {"ts": [f"2026-01-01T00:00:0{i}Z" for i in range(5)], "sensor": ["a"] * 5,
               "value": ["1.5", "I/O Timeout", "Shutdown", "I/O Timeout", "2,5"]}
    with pytest.raises(MappingError, match=r"cannot convert '2,5' at row 5 of a.csv to double: a number with another "
                                           r"decimal mark \(--decimal ',' reads it"):
        _map(columns, target=target, states_column="state")  # a number written another way is never a state
    kept = _map({**columns, "value": columns["value"][:4]} | {"ts": columns["ts"][:4], "sensor": ["a"] * 4},
                target=target, states_column="state")
    assert kept.table.column("value").to_pylist() == [1.5, None, None, None]
    assert kept.table.column("state").to_pylist() == [None, "I/O Timeout", "Shutdown", "I/O Timeout"]
    assert kept.states == {"I/O Timeout": 2, "Shutdown": 1} and not kept.rejected and not kept.issues.entries
    with pytest.raises(MappingError, match="states column 'value' is double: it needs a string column of its own"):
        _map(columns, target=target, states_column="value")


def test_reasons_and_days_place_every_row_left_out() -> None:
    columns = {"ts": ["2026-01-01T10:00:00Z", "2026-01-02T10:00:00Z", None, "2026-01-02T11:00:00Z"],
               "sensor": ["a"] * 4, "value": ["1", "x", "2", "3"]}
    mapped = _map(columns, on_bad_value="reject")
    assert mapped.dropped.to_pylist() == [False, True, True, False]
    assert mapped.reasons.to_pylist() == [None, "bad_value in value", "null_time in ts", None]
    day = datetime(2026, 1, 2, tzinfo=UTC).timestamp() // 86400
    assert mapped.issue_days == {day: 1}  # the row without a time belongs to no day


def test_footer_bounds_of_many_files_convert_together_and_each_keeps_its_own() -> None:
    """Planning converts every file's time statistics at once: each file gets its own span, in UTC
    microseconds, whatever the other files' types; a local time (a DST fold may reorder it) gets none."""
    schema = pa.schema([("ts", pa.timestamp("ms", "UTC")), ("sensor", pa.string()), ("value", pa.float64())])
    mapper = _mapper(schema)
    jan, feb = _utc(2024, 1, 1), _utc(2024, 2, 1)
    ms = [int(t.timestamp() * 1000) for t in (jan, feb)]
    spans = mapper.utc_bounds([
        (pa.timestamp("ms", "UTC"), ms[0], ms[1]),
        (pa.timestamp("us", "UTC"), ms[0] * 1000, ms[0] * 1000 + 5),
        (pa.timestamp("ms"), ms[0], ms[1]),
        (pa.timestamp("ms", "UTC"), ms[1], ms[1] + 1),
    ])
    assert spans == [(ms[0] * 1000, ms[1] * 1000), (ms[0] * 1000, ms[0] * 1000 + 5), None,
                     (ms[1] * 1000, ms[1] * 1000 + 1000)]
    assert mapper.utc_bounds([]) == []
