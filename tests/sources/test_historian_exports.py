"""Historian exports as plants send them, each loaded through the real CLI and compared with the
generator's truth: every row (so every sum), the instants around the clock changes, the states kept,
and a report that accounts for every source row. Then the export that loads wrong unless told how:
30 % of its values unreadable fails before publish, main untouched, and its dry run says so (exit 3).

The truth is a list of (UTC instant, series, value, state) rows; each shape writes it as its tool
would (local wall-clock text, one column per tag, quoted "1,234.5", a title and a units line) and the
table must hold exactly those rows.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest

import timelake
from tests.conftest import cli_in_process

UTC = timezone.utc
STATES = ["I/O Timeout", "Shutdown", "Bad Input"]


@dataclass(frozen=True, order=True)
class Reading:
    at: datetime  # UTC
    series: tuple[str, ...]
    value: float | None
    state: str | None = None


def instants(zone: str, windows: list[tuple[str, str]], step_minutes: int) -> list[datetime]:
    """UTC instants every ``step_minutes`` over local windows [start, end): through a fall-back night the
    local clock shows its repeated hour twice, as a historian's export does."""
    tz = ZoneInfo(zone)
    found = []
    for start, end in windows:
        at = datetime.fromisoformat(start).replace(tzinfo=tz).astimezone(UTC)
        stop = datetime.fromisoformat(end).replace(tzinfo=tz).astimezone(UTC)
        while at < stop:
            found.append(at)
            at += timedelta(minutes=step_minutes)
    return found


def plant(times: list[datetime], series: list[tuple[str, ...]], seed: int, blanks: float = 0.0,
          states: float = 0.0) -> list[Reading]:
    """A value per series and instant (one decimal, some above 1,000), some left out (blank cells) and
    some digital states instead of a value."""
    rng = random.Random(seed)
    rows = []
    for at in times:
        for key in series:
            roll = rng.random()
            if roll < blanks:
                continue
            if roll < blanks + states:
                rows.append(Reading(at, key, None, rng.choice(STATES)))
            else:
                rows.append(Reading(at, key, round(rng.uniform(-40, 4000), 1)))
    return rows


def local(at: datetime, zone: str) -> datetime:
    return at.astimezone(ZoneInfo(zone))


def repeated_hour(at: datetime, zone: str) -> bool:
    """Whether ``at`` reads, in ``zone``, as a wall-clock time that a fall-back night shows twice."""
    wall = local(at, zone)
    return wall.replace(fold=1 - wall.fold).utcoffset() != wall.utcoffset()


def run(*args: str, warehouse: Path) -> tuple[int, str]:
    return cli_in_process(*args, "--warehouse", str(warehouse))


def table_rows(warehouse: Path, table: str, keys: list[str], state: bool = False) -> list[Reading]:
    rows = timelake.connect(warehouse=warehouse).table(table).to_arrow().to_pylist()
    return sorted(Reading(r["ts"], tuple(r[k] for k in keys), r["value"], r["state"] if state else None) for r in rows)


def last_report(warehouse: Path) -> dict:
    return timelake.connect(warehouse=warehouse).jobs()[-1].report()


def assert_loaded_exactly(report: dict, got: list[Reading], truth: list[Reading], zone: str) -> None:
    """Every row, so every sum; the rows of the repeated hours named apart; nothing left out unsaid."""
    assert report["phase"] == "published", report["error"]
    assert got == sorted(truth)
    assert math.fsum(r.value for r in got if r.value is not None) == pytest.approx(
        math.fsum(r.value for r in truth if r.value is not None), rel=1e-12)
    repeated = [r.at for r in truth if repeated_hour(r.at, zone)]
    assert repeated and sorted(r.at for r in got if r.at in set(repeated)) == sorted(repeated)
    assert report["rows_rejected"]["total"] == 0 and report["values_nulled"]["total"] == 0
    assert report["reject_budget"]["passed"] and report["reject_budget"]["counted"] == 0
    assert report["rows_in_source"] == report["rows_written"] + report["rows_duplicate_in_source"] + \
        report["rows_conflicting_existing"]


def test_a_wide_ignition_export_loads_one_row_per_tag_and_sample(tmp_path, warehouse):
    """Ignition's tag history: t_stamp in local time with milliseconds, a column per tag path, blank
    where a tag logged nothing; tag paths split into site and tag."""
    zone = "America/Chicago"
    tags = [("Plant1", "FIC-101"), ("Plant1", "TI-102"), ("Plant2", "PI-201")]
    times = instants(zone, [("2026-11-01T00:00", "2026-11-01T03:00")], 5)
    truth = plant(times, tags, seed=1, blanks=0.15)
    cells = {(r.at, r.series): r.value for r in truth}
    lines = ["t_stamp," + ",".join("/".join(t) for t in tags)]
    for at in times:
        row = [f"{cells[(at, t)]:.1f}" if (at, t) in cells else "" for t in tags]
        lines.append(f"{local(at, zone):%Y-%m-%d %H:%M:%S}.000," + ",".join(row))
    (tmp_path / "ignition.csv").write_text("\n".join(lines) + "\n")
    assert run("table", "create", "plant.history", "--schema", "ts timestamptz, site string, tag string, value double",
               "--series", "site,tag", warehouse=warehouse)[0] == 0
    code, err = run("backfill", "plant.history", "--from", str(tmp_path / "ignition.csv"), "--wide", "--key-separator", "/",
                    "--map", "ts=t_stamp", "--tz", zone, warehouse=warehouse)
    assert code == 0, err
    report = last_report(warehouse)
    assert report["rows_in_source"] == len(truth)  # blank cells are no sample, not a row
    assert_loaded_exactly(report, table_rows(warehouse, "plant.history", ["site", "tag"]), truth, zone)


def _pi_export(path: Path, truth: list[Reading], zone: str, grouped: float) -> None:
    """PI's long export: a block per tag in time order, 12-hour times, some values written "1,234.5"
    (quoted: the file's delimiter is a comma too) and digital states as text."""
    rng = random.Random(7)
    lines = ["Tag,Timestamp,Value"]
    for r in sorted(truth, key=lambda r: (r.series, r.at)):
        t = local(r.at, zone)
        when = f"{t.month}/{t.day}/{t.year} {t.hour % 12 or 12}:{t.minute:02d}:{t.second:02d} {'AM' if t.hour < 12 else 'PM'}"
        cell = r.state if r.state else f'"{r.value:,.1f}"' if rng.random() < grouped else f"{r.value:.1f}"
        lines.append(f"{r.series[0]},{when},{cell}")
    path.write_text("\n".join(lines) + "\n")


def test_a_pi_export_with_12_hour_times_states_and_grouped_numbers(tmp_path, warehouse):
    """Each thing the file needs is named by the error it causes, then the load is exact."""
    zone = "America/New_York"
    truth = plant(instants(zone, [("2026-11-01T00:00", "2026-11-01T03:00")], 5), [("FIC-101",), ("TI-102",)],
                  seed=2, states=0.05)
    path = tmp_path / "pi.csv"
    _pi_export(path, truth, zone, grouped=0.3)
    assert run("table", "create", "plant.pi", "--schema", "ts timestamptz, tag string, value double, state string",
               "--series", "tag", warehouse=warehouse)[0] == 0
    base = ["backfill", "plant.pi", "--from", str(path), "--map", "ts=Timestamp,tag=Tag,value=Value", "--tz", zone]
    code, err = run(*base, "--dry-run", warehouse=warehouse)
    first = f"{local(min(r.at for r in truth if r.series == ('FIC-101',)), zone):%-m/%-d/%Y %-I:%M:%S %p}"
    assert code == 3 and f"cannot convert '{first}' at line 2 of " in err
    assert "--timestamp-format '%m/%d/%Y %I:%M:%S %p' reads it" in err
    base += ["--timestamp-format", "%m/%d/%Y %I:%M:%S %p"]
    code, err = run(*base, "--on-bad-value", "reject", "--dry-run", warehouse=warehouse)
    grouped = sum(1 for line in path.read_text().splitlines() if line.endswith('"') and "," in line.split('"')[1])
    assert code == 3 and "over the default budget of 0.1%" in err
    assert f"column 'value': {grouped:,} rejected, thousands separator" in err and "--thousands ',' reads it" in err
    assert f"{sum(1 for r in truth if r.state):,} rejected, text" in err and "--states-column NAME keeps such states" in err
    code, err = run(*base, "--thousands", ",", "--states-column", "state", warehouse=warehouse)
    assert code == 0, err
    report = last_report(warehouse)
    assert_loaded_exactly(report, table_rows(warehouse, "plant.pi", ["tag"], state=True), truth, zone)
    counts: dict[str, int] = {}
    for r in truth:
        if r.state:
            counts[r.state] = counts.get(r.state, 0) + 1
    assert report["states"] == {"column": "state", "rows": sum(counts.values()), "counts": counts}


def test_gateway_json_lines_dedup_across_files_and_live_rows_win(tmp_path, warehouse):
    """An edge gateway's JSON lines: epoch milliseconds, a quality flag mapped like any column, a
    reconnect that sent some lines twice (in two files), and rows the live path has already written."""
    zone = "Europe/Berlin"
    series = [("gw-1", "temp"), ("gw-1", "pressure"), ("gw-2", "temp")]
    truth = plant(instants(zone, [("2026-10-25T00:00", "2026-10-25T04:00")], 10), series, seed=3)
    quality = {r: random.Random(hash((r.at, r.series))).choice(["GOOD", "UNCERTAIN"]) for r in truth}
    ordered = sorted(truth, key=lambda r: r.at)
    half = len(ordered) // 2
    for name, part in (("a.jsonl", ordered[: half + 9]), ("b.jsonl", ordered[half:])):  # 9 lines sent twice
        (tmp_path / name).write_text("".join(json.dumps(
            {"time": int(r.at.timestamp() * 1000), "device": r.series[0], "metric": r.series[1], "value": r.value,
             "q": quality[r]}) + "\n" for r in part))
    assert run("table", "create", "plant.gateway", "--schema",
               "ts timestamptz, device string, metric string, value double, quality string", "--series", "device,metric",
               warehouse=warehouse)[0] == 0
    lake = timelake.connect(warehouse=warehouse)
    live = ordered[40:46]
    lake.table("plant.gateway").append(pa.table({
        "ts": pa.array([r.at for r in live], pa.timestamp("us", "UTC")), "device": [r.series[0] for r in live],
        "metric": [r.series[1] for r in live], "value": [-1.0] * len(live), "quality": ["LIVE"] * len(live)}))
    code, err = run("backfill", "plant.gateway", "--from", f"{tmp_path}/*.jsonl", "--map", "ts=time,quality=q",
                    "--time-unit", "ms", warehouse=warehouse)
    assert code == 0, err
    report = last_report(warehouse)
    assert report["rows_in_source"] == len(truth) + 9
    assert report["rows_duplicate_in_source"] == 9 and report["rows_conflicting_existing"] == len(live)
    expected = [Reading(r.at, r.series, -1.0 if r in live else r.value) for r in truth]
    assert_loaded_exactly(report, table_rows(warehouse, "plant.gateway", ["device", "metric"]), expected, zone)
    stored = {(r["ts"], r["device"], r["metric"]): r["quality"] for r in lake.table("plant.gateway").to_arrow().to_pylist()}
    assert stored == {(r.at, *r.series): "LIVE" if r in live else quality[r] for r in truth}


def test_a_german_excel_sheet_with_title_and_units_lines_over_both_clock_changes(tmp_path, warehouse):
    """Excel's 'CSV (semicolon)' of a wide sheet: a title line, the header, a units line; Windows-1252,
    dotted dates without seconds, decimal comma and '.' grouping thousands; blank cells; the spring and
    the autumn change in one file."""
    zone = "Europe/Berlin"
    tags = [("TI-101",), ("TI-102",), ("PI-201",)]
    times = instants(zone, [("2026-03-29T00:00", "2026-03-29T05:00"), ("2026-10-25T00:00", "2026-10-25T05:00")], 15)
    truth = plant(times, tags, seed=4, blanks=0.1)
    cells = {(r.at, r.series): r.value for r in truth}

    def german(value: float) -> str:
        return f"{value:,.1f}".replace(",", "_").replace(".", ",").replace("_", ".")

    lines = ["Messwerte Anlage 3 – Export vom 26.10.2026", "Zeitstempel;" + ";".join(t[0] for t in tags), ";°C;°C;bar"]
    for at in times:
        row = [german(cells[(at, t)]) if (at, t) in cells else "" for t in tags]
        lines.append(f"{local(at, zone):%d.%m.%Y %H:%M};" + ";".join(row))
    (tmp_path / "anlage3.csv").write_bytes(("\r\n".join(lines) + "\r\n").encode("cp1252"))
    assert run("table", "create", "anlage.messwerte", "--schema", "ts timestamptz, messstelle string, value double",
               "--series", "messstelle", warehouse=warehouse)[0] == 0
    code, err = run("backfill", "anlage.messwerte", "--from", str(tmp_path / "anlage3.csv"), "--wide", "--map",
                    "ts=Zeitstempel", "--tz", zone, "--delimiter", ";", "--decimal", ",", "--thousands", ".",
                    "--skip-rows", "1", "--skip-after-header", "1", "--encoding", "cp1252", warehouse=warehouse)
    assert code == 0, err
    report = last_report(warehouse)
    got = table_rows(warehouse, "anlage.messwerte", ["messstelle"])
    assert_loaded_exactly(report, got, truth, zone)
    around_the_gap = {datetime(2026, 3, 29, 0, 45, tzinfo=UTC), datetime(2026, 3, 29, 1, 0, tzinfo=UTC)}  # 01:45 CET, 03:00 CEST
    assert around_the_gap <= {r.at for r in got}


def test_thirty_percent_unreadable_fails_before_publish_and_the_dry_run_says_so(tmp_path, warehouse):
    """A third of the values written "1,234.5" without --thousands: counted, named with the option that
    reads them, and the job refuses before it writes; main keeps what it had."""
    zone = "America/New_York"
    truth = plant(instants(zone, [("2026-02-26T00:00", "2026-02-26T08:00")], 5), [("FIC-101",), ("TI-102",)], seed=5)
    path = tmp_path / "pi.csv"
    _pi_export(path, truth, zone, grouped=0.4)  # a quoted value under 1,000 has no separator: readable
    unreadable = sum(1 for line in path.read_text().splitlines() if line.endswith('"') and "," in line.split('"')[1])
    assert 0.25 < unreadable / len(truth) < 0.35
    assert run("table", "create", "plant.pi", "--schema", "ts timestamptz, tag string, value double",
               "--series", "tag", warehouse=warehouse)[0] == 0
    lake = timelake.connect(warehouse=warehouse)
    table = lake.table("plant.pi")
    table.append(pa.table({"ts": pa.array([datetime(2026, 2, 25, tzinfo=UTC)], pa.timestamp("us", "UTC")),
                           "tag": ["FIC-101"], "value": [1.0]}))
    before = table.refresh().iceberg.metadata.refs["main"].snapshot_id
    args = ["backfill", "plant.pi", "--from", str(path), "--map", "ts=Timestamp,tag=Tag,value=Value", "--tz", zone,
            "--timestamp-format", "%m/%d/%Y %I:%M:%S %p"]
    budget = (f"{unreadable:,} of {len(truth):,} source rows ({100 * unreadable / len(truth):.3g} %) were rejected or had "
              f"a value nulled, over the default budget of 0.1% ({len(truth) // 1000:,} rows; --max-rejected sets it): "
              f"column 'value': {unreadable:,}")
    for policy in ("reject", "null"):
        code, err = run(*args, "--on-bad-value", policy, "--dry-run", warehouse=warehouse)
        assert code == 3 and err.strip().splitlines()[-1].startswith(f"the run would fail: {budget}"), err
        assert "thousands separator" in err and "--thousands ',' reads it" in err
        code, err = run(*args, "--on-bad-value", policy, warehouse=warehouse)
        assert code == 1 and f"validation failed (reject_budget): {budget} {policy}ed, thousands separator" in err, err
        assert "nothing was written or published, main is untouched" in err
        job = lake.jobs()[-1]
        assert job.record().phase == "failed_validation"
        report = job.report()
        counted = report["values_nulled"]["total"] if policy == "null" else report["rows_rejected"]["total"]
        assert counted == unreadable and report["reject_budget"]["counted"] == unreadable
        kinds = (report["values_nulled"] if policy == "null" else report["rows_rejected"])["by_column"]["value"]
        assert kinds["thousands separator"]["rows"] == unreadable and kinds["thousands separator"]["fix"] == "--thousands ',' reads it"
        assert [c["name"] for c in report["checks"] if not c["passed"]] == ["reject_budget"]
    table.refresh()
    assert table.iceberg.metadata.refs["main"].snapshot_id == before
    assert [r for r in table.iceberg.metadata.refs if r != "main"] == [] and lake.leases("plant.pi") == []
    assert table.to_arrow().num_rows == 1
    code, err = run(*args, "--on-bad-value", "null", "--max-rejected", "35%", warehouse=warehouse)
    assert code == 0, err
    report = last_report(warehouse)
    assert report["values_nulled"]["total"] == unreadable and report["rows_written"] == len(truth)
    assert table.refresh().to_arrow().num_rows == len(truth) + 1
