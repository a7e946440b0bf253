"""Instants, ISO-8601 durations and partition arithmetic, all in UTC microseconds.

Event time is the truth of a time-series table, so every instant the engine handles is an int of
UTC microseconds; calendar units (month, year) are only used to cut partitions and to apply
retention, where a month really is a month.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import overload
from zoneinfo import ZoneInfo

import numpy as np

US_PER_SECOND = 1_000_000
US_PER_HOUR = 3_600 * US_PER_SECOND
US_PER_DAY = 24 * US_PER_HOUR
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_DURATION = re.compile(
    r"^P(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)


def parse_duration(text: str) -> dict[str, int]:
    """Parse an ISO-8601 duration such as ``P3Y`` or ``P90D`` into its parts."""
    match = _DURATION.match(text.strip().upper()) if text else None
    if not match or text.strip().upper() in ("P", "PT"):
        raise ValueError(f"'{text}' is not an ISO-8601 duration (examples: P3Y, P90D, PT12H)")
    return {k: int(v) for k, v in match.groupdict().items() if v}


def subtract_duration(instant: datetime, text: str) -> datetime:
    """``instant - duration`` with calendar years and months (clamping the day, as calendars do)."""
    parts = parse_duration(text)
    months = parts.get("years", 0) * 12 + parts.get("months", 0)
    if months:
        total = instant.year * 12 + instant.month - 1 - months
        year, month = divmod(total, 12)
        month += 1
        day = min(instant.day, _days_in_month(year, month))
        instant = instant.replace(year=year, month=month, day=day)
    return instant - timedelta(
        weeks=parts.get("weeks", 0),
        days=parts.get("days", 0),
        hours=parts.get("hours", 0),
        minutes=parts.get("minutes", 0),
        seconds=parts.get("seconds", 0),
    )


def _days_in_month(year: int, month: int) -> int:
    nxt = date(year + month // 12, month % 12 + 1, 1)
    return (nxt - timedelta(days=1)).day


def parse_size(text: str | int) -> int:
    """Parse ``128MB`` / ``1GiB`` / ``1048576`` into bytes."""
    if isinstance(text, int):
        return text
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)?\s*$", text.upper())
    if not match:
        raise ValueError(f"'{text}' is not a size (examples: 128MB, 512KiB, 1048576)")
    number, unit = float(match.group(1)), (match.group(2) or "B").replace("I", "").rstrip("B")
    return int(number * 1024 ** " KMGT".index(unit or " "))


@overload
def parse_instant(value: str | datetime | date, tz: str | None = None) -> datetime: ...
@overload
def parse_instant(value: None, tz: str | None = None) -> None: ...
@overload
def parse_instant(value: str | datetime | date | None, tz: str | None = None) -> datetime | None: ...
def parse_instant(value: str | datetime | date | None, tz: str | None = None) -> datetime | None:
    """An instant from user input; naive values are local time in ``tz`` (UTC when no tz is given)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime(value.year, value.month, value.day)
    else:
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError(f"'{value}' is not an ISO-8601 date or time (example: 2024-01-01 or 2024-01-01T00:00:00Z)") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=ZoneInfo(tz) if tz else UTC)
    return parsed.astimezone(UTC)


def to_micros(instant: datetime) -> int:
    delta = instant.astimezone(UTC) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_SECOND + delta.microseconds


def from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(micros))


@overload
def iso(micros: int) -> str: ...
@overload
def iso(micros: None) -> None: ...
@overload
def iso(micros: int | None) -> str | None: ...
def iso(micros: int | None) -> str | None:
    """UTC ISO-8601 text for reports."""
    return None if micros is None else from_micros(micros).isoformat().replace("+00:00", "Z")


# Partition transforms, matching Iceberg's: values are hours/days/months/years since the epoch.
TRANSFORMS = ("hour", "day", "month", "year")


@overload
def iso_seconds(seconds: float) -> str: ...
@overload
def iso_seconds(seconds: None) -> None: ...
@overload
def iso_seconds(seconds: float | None) -> str | None: ...
def iso_seconds(seconds: float | None) -> str | None:
    """An epoch time in seconds (``time.time()``, as job records keep them) as ISO text."""
    return None if seconds is None else iso(round(seconds * 1_000_000))


def transform_values(micros: np.ndarray, transform: str) -> np.ndarray:
    """Vectorised Iceberg time transform of UTC microseconds."""
    if transform == "hour":
        return np.floor_divide(micros, US_PER_HOUR)
    days = np.floor_divide(micros, US_PER_DAY)
    if transform == "day":
        return days
    dates = days.astype("datetime64[D]")
    months = dates.astype("datetime64[M]").astype(np.int64)
    if transform == "month":
        return months
    if transform == "year":
        return np.floor_divide(months, 12)
    raise ValueError(f"unknown partition transform '{transform}' (one of {', '.join(TRANSFORMS)})")


def transform_range(transform: str, value: int) -> tuple[int, int]:
    """[start, end) in UTC microseconds of one partition value."""
    if transform == "hour":
        return value * US_PER_HOUR, (value + 1) * US_PER_HOUR
    if transform == "day":
        return value * US_PER_DAY, (value + 1) * US_PER_DAY
    if transform == "month":
        return _month_start(value), _month_start(value + 1)
    if transform == "year":
        return _month_start(value * 12), _month_start((value + 1) * 12)
    raise ValueError(f"unknown partition transform '{transform}'")


def _month_start(months_since_epoch: int) -> int:
    year, month = divmod(months_since_epoch, 12)
    return to_micros(datetime(1970 + year, month + 1, 1, tzinfo=UTC))


def floor_to(micros: int, transform: str) -> int:
    """Start of the partition (hour/day/week/month/year) that holds ``micros``."""
    if transform == "week":
        days = micros // US_PER_DAY
        monday = days - (days + 3) % 7  # 1970-01-01 was a Thursday
        return monday * US_PER_DAY
    value = int(transform_values(np.array([micros], dtype=np.int64), transform)[0])
    return transform_range(transform, value)[0]


def partition_starts(low: int, high: int, transform: str, most: int) -> list[int] | None:
    """The starts (UTC microseconds) of the partitions after the one that holds ``low``, up to the one
    that holds ``high``; None when there are more than ``most`` of them."""
    first, last = transform_values(np.array([low, high], dtype=np.int64), transform).tolist()
    if last - first > most:
        return None
    return [transform_range(transform, value)[0] for value in range(first + 1, last + 1)]


def next_boundary(micros: int, transform: str) -> int:
    """Start of the partition after the one that holds ``micros``."""
    if transform == "week":
        return floor_to(micros, "week") + 7 * US_PER_DAY
    value = int(transform_values(np.array([micros], dtype=np.int64), transform)[0])
    return transform_range(transform, value)[1]
