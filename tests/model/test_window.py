"""Quiet hours as wall-clock time in their zone: checked against a minute-by-minute walk of the local clock,
across midnight and both daylight-saving changes."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from timelake.model.spec import JobSpec
from timelake.model.window import Window, iso_local, window_of

BERLIN = "Europe/Berlin"


def walk_to_opening(window: Window, instant: float) -> float:
    """The first whole minute (of UTC) from ``instant`` at which the local clock is inside the window,
    found by stepping: the reference `Window.next_open` must agree with."""
    zone = ZoneInfo(window.tz)
    t = instant
    while True:
        local = datetime.fromtimestamp(t, zone)
        minute = local.hour * 60 + local.minute
        inside = window.start <= minute < window.end if window.start < window.end else (
            minute >= window.start or minute < window.end)
        if inside:
            return t
        t = (t // 60 + 1) * 60


@pytest.mark.parametrize("between", ["22:00-06:00", "02:30-03:30", "01:00-02:30", "00:00-23:59", "09:15-09:16"])
@pytest.mark.parametrize("days", [("2030-03-29", 4), ("2030-10-25", 4), ("2030-07-01", 2)])
def test_next_opening_is_the_first_minute_inside_the_window(between: str, days: tuple[str, int]) -> None:
    window = Window.parse(between, BERLIN)
    first, count = days
    start = datetime.fromisoformat(first).replace(tzinfo=ZoneInfo(BERLIN)).timestamp()
    for step in range(0, count * 24 * 60, 23):  # every 23rd minute: every minute of the hour is met in a day
        instant = start + step * 60 + 13  # and not on a whole minute
        expected = walk_to_opening(window, instant)
        opened = window.next_open(instant)
        assert window.contains(opened)
        # the walk steps minute by minute; inside a minute the window opens at once
        assert expected - 60 < opened <= expected, (between, iso_local(instant, BERLIN), iso_local(opened, BERLIN))
        if window.contains(instant):
            assert opened == instant


def test_the_window_moves_with_daylight_saving_time() -> None:
    window = Window.parse("22:00-06:00", BERLIN)
    winter = datetime.fromisoformat("2030-01-07T12:00:00+00:00").timestamp()
    summer = datetime.fromisoformat("2030-07-07T12:00:00+00:00").timestamp()
    assert datetime.fromtimestamp(window.next_open(winter), ZoneInfo("UTC")).hour == 21
    assert datetime.fromtimestamp(window.next_open(summer), ZoneInfo("UTC")).hour == 20
    # spring forward: 02:30 never shows on the clock; a window from 02:30 opens when the clock jumps to 03:00
    gap = Window.parse("02:30-03:30", BERLIN)
    opened = gap.next_open(datetime.fromisoformat("2030-03-31T00:30:00+01:00").timestamp())
    assert iso_local(opened, BERLIN) == "2030-03-31T03:00:00+02:00"


def test_the_job_model_takes_the_window_in_its_zone() -> None:
    base = {"table": "iot.sensor", "source": "x.parquet", "run_between": "22:00-06:00"}
    assert JobSpec.model_validate(base).window() == Window(22 * 60, 6 * 60, "UTC")
    assert JobSpec.model_validate({**base, "tz": BERLIN}).window().tz == BERLIN
    assert JobSpec.model_validate({**base, "tz": BERLIN, "run_tz": "America/New_York"}).window().tz == "America/New_York"
    assert window_of({"source": "x"}) is None
    for fields, message in (({"run_between": "25:00-06:00"}, "hours run 00-23"),
                            ({"run_between": "22:00-22:00"}, "starts where it ends"),
                            ({"run_between": "10pm-6am"}, "is not HH:MM-HH:MM"),
                            ({"run_tz": "Mars/Olympus"}, "unknown time zone"),
                            ({"run_between": None, "run_tz": BERLIN}, "give run_between")):
        with pytest.raises(ValueError, match=message):
            JobSpec.model_validate({**base, **fields})
