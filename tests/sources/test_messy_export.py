"""A historian export as it arrives: German columns, ';' and decimal comma, naive Europe/Berlin time across
both clock changes, 'n/a' and '#ERR' cells, duplicate rows and a missing week. The dry run must predict the
run's counts, and the published rows must equal an independent pandas reference (ambiguous='infer')."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import cli

ZONE = "Europe/Berlin"
SENSORS = ["TI-101", "TI-102", "PI-201"]
DAYS = [date(2026, 3, 28) + timedelta(d) for d in range(3)] + [
    date(2026, 10, 10) + timedelta(d) for d in range(17) if not 2 <= d <= 8]  # 12-18 Oct missing
MAP = {"ts": "Zeitstempel", "device_id": "Messstelle", "value": "Messwert"}
OPTIONS = {"map": MAP, "tz": ZONE, "format": "csv", "delimiter": ";", "decimal": ",", "on_bad_value": "reject",
           "max_rejected": "1%"}  # '#ERR' in 0.4 % of the cells


def _export(folder: Path) -> None:
    """One file per local day, rows in time order with the sensors interleaved, as historians write them."""
    rng = np.random.default_rng(7)
    folder.mkdir()
    for day in DAYS:
        start = pd.Timestamp(day).tz_localize(ZONE).tz_convert("UTC")
        end = pd.Timestamp(day + timedelta(1)).tz_localize(ZONE).tz_convert("UTC")
        instants = pd.date_range(start, end, freq="1min", inclusive="left")
        local = instants.tz_convert(ZONE).strftime("%d.%m.%Y %H:%M:%S")
        lines = ["Zeitstempel;Messstelle;Messwert"]
        for when in local:
            for sensor in SENSORS:
                roll = rng.random()
                value = "n/a" if roll < 0.004 else "#ERR" if roll < 0.008 else f"{rng.uniform(-20, 80):.2f}".replace(".", ",")
                line = f"{when};{sensor};{value}"
                lines.extend([line, line] if rng.random() < 0.003 else [line])
        (folder / f"export_{day:%Y%m%d}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _reference(folder: Path) -> tuple[pa.Table, int, int]:
    """Published rows, rejected rows and duplicate rows, computed with pandas alone."""
    frames = [pd.read_csv(path, sep=";", dtype=str, keep_default_na=False) for path in sorted(folder.glob("*.csv"))]
    raw = pd.concat(frames, ignore_index=True)
    local = pd.to_datetime(raw["Zeitstempel"], format="%d.%m.%Y %H:%M:%S")
    raw["ts"] = pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]")
    for _, series in raw.groupby("Messstelle", sort=False):  # the clock is read from every row, as exported
        times = local[series.index]
        repeat = times.eq(times.shift())  # a duplicated line: pandas' infer takes it for a clock change
        first = times[~repeat]
        raw.loc[first.index, "ts"] = pd.DatetimeIndex(first).tz_localize(ZONE, ambiguous="infer").tz_convert("UTC")
        raw.loc[series.index, "ts"] = raw.loc[series.index, "ts"].ffill()
    bad = raw["Messwert"] == "#ERR"
    rows = raw[~bad]
    unique = rows.drop_duplicates(["Messstelle", "ts"], keep="last")
    parts = [pd.DataFrame({"ts": unique["ts"], "device_id": unique["Messstelle"],
                           "value": pd.to_numeric(unique["Messwert"].replace("n/a", None).str.replace(",", "."))})]
    expected = pd.concat(parts).sort_values(["device_id", "ts"])
    table = pa.table({"ts": pa.array(expected["ts"].dt.as_unit("us")), "device_id": expected["device_id"],
                      "value": expected["value"]})
    return table, int(bad.sum()), len(rows) - len(unique)


def test_dry_run_predicts_the_run_and_rows_match_pandas(sensor, tmp_path):
    folder = tmp_path / "export"
    _export(folder)
    expected, rejected, duplicates = _reference(folder)
    assert rejected and duplicates  # the export really is messy
    dry = sensor.backfill(source=str(folder), dry_run=True, **OPTIONS).wait().report()
    run = sensor.backfill(source=str(folder), **OPTIONS).wait().report()
    counted = ("rows_in_source", "rows_in_scope", "rows_rejected", "rows_duplicate_in_source", "dst_policy")
    assert {k: dry[k] for k in counted} == {k: run[k] for k in counted}
    assert run["dst_policy"] == "infer"
    assert run["rows_rejected"]["reasons"] == {"bad_value": rejected}
    assert len(run["rows_rejected"]["examples"]["bad_value"].split(" | ")) == 5
    assert run["rows_duplicate_in_source"] == duplicates
    assert run["rows_in_source"] == run["rows_written"] + rejected + duplicates
    published = sensor.to_arrow().sort_by([("device_id", "ascending"), ("ts", "ascending")])
    assert published.num_rows == expected.num_rows
    assert published.column("ts").to_pylist() == expected.column("ts").cast(published.column("ts").type).to_pylist()
    assert published.column("device_id").to_pylist() == expected.column("device_id").to_pylist()
    assert published.column("value").to_pylist() == pytest.approx(expected.column("value").to_pylist(), nan_ok=True)
    gaps = [(g["start"][:10], g["end"][:10]) for g in run["source_gaps"]]
    assert ("2026-10-12", "2026-10-17") in gaps  # UTC days without a row: the missing local week


def test_dry_run_names_the_failure_and_the_flag_and_exits_3(warehouse, sensor, tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "a.csv").write_text("Zeitstempel;Messstelle;Messwert\n25.10.2026 01:30:00;TI-101;1,5\n"
                                  "25.10.2026 01:31:00;TI-101;#ERR\n", encoding="utf-8")
    args = ["backfill", "run", "iot.sensor", "--from", str(folder), "--map", "ts=Zeitstempel,device_id=Messstelle,"
            "value=Messwert", "--tz", ZONE, "--delimiter", ";", "--decimal", ",", "--dry-run"]
    failing = cli(*args, warehouse=warehouse, check=False)
    assert failing.returncode == 3, failing.stderr
    last = failing.stderr.strip().splitlines()[-1]
    assert last.startswith("the run would fail:") and "'#ERR'" in last and "--on-bad-value" in last
    assert "Traceback" not in failing.stderr
    over = cli(*args, "--on-bad-value", "reject", warehouse=warehouse, check=False)
    assert over.returncode == 3 and "over the default budget of 0.1% (0 rows" in over.stderr
    passing = cli(*args, "--on-bad-value", "reject", "--max-rejected", "1", warehouse=warehouse)
    assert passing.returncode == 0


def test_one_pass_through_the_repeated_hour_cannot_be_inferred(sensor, tmp_path):
    path = tmp_path / "one_pass.csv"
    path.write_text("ts,device_id,value\n2026-10-25 01:59:00,a,1\n2026-10-25 02:30:00,a,2\n"
                    "2026-10-25 03:00:00,a,3\n", encoding="utf-8")
    dry = sensor.backfill(source=str(path), tz=ZONE, dry_run=True).wait().report()
    assert "series device_id=a at 2026-10-25 02:00 local" in dry["would_fail"]
    assert "--dst-policy earliest|latest|drop" in dry["would_fail"]
    with pytest.raises(Exception, match="cannot infer the clock change .* series device_id=a at 2026-10-25 02:00"):
        sensor.backfill(source=str(path), tz=ZONE).wait()
    assert sensor.to_arrow().num_rows == 0
    run = sensor.backfill(source=str(path), tz=ZONE, dst_policy="earliest").wait().report()
    assert run["rows_written"] == 3 and run["dst_policy"] == "earliest"
