"""The rule semantics written out plainly, as the reference the rules tests (embedded and on AWS) compare with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

import timelake
from tests.conftest import recent


def day(days_ago: int) -> datetime:
    return datetime.fromisoformat(recent(days_ago)).replace(tzinfo=UTC)


def heat(rows: pa.Table, device: str, start: datetime, end: datetime, value: float = 95.0) -> pa.Table:
    """``rows`` with ``device``'s values in [start, end) set to ``value``."""
    ts = rows.column("ts")
    mask = pc.and_(pc.equal(rows.column("device_id"), device),
                   pc.and_(pc.greater_equal(ts, pa.scalar(start, ts.type)), pc.less(ts, pa.scalar(end, ts.type))))
    return rows.set_column(2, "value", pc.if_else(mask, value, rows.column("value")))


def reference(rows: pa.Table, lo: datetime | None = None, hi: datetime | None = None) -> list[tuple]:
    """The rule semantics written out as a loop: per series and rule, a run of consecutive matching
    samples fires once, at its first sample at least the duration after the run's first sample."""
    rules = [("hot", lambda v: v > 80, timedelta(minutes=20)), ("cold", lambda v: v < 4, timedelta(0))]
    events = []
    for device in sorted(set(rows.column("device_id").to_pylist())):
        series = sorted((r["ts"], r["value"]) for r in rows.filter(pc.equal(rows.column("device_id"), device)).to_pylist())
        for name, hit, hold in rules:
            start, fired = None, False
            for ts, value in series:
                if value is None or not hit(value):
                    start, fired = None, False
                    continue
                start = start or ts
                if not fired and ts - start >= hold:
                    fired = True
                    if (lo is None or ts >= lo) and (hi is None or ts < hi):
                        events.append((name, device, start, ts, value))
    return sorted(events)


def recorded(table: timelake.Table, source: str) -> list[tuple]:
    events = table.events()
    if events.num_rows == 0:
        return []
    rows = events.filter(pc.equal(events.column("source"), source)).to_pylist()
    return sorted((e["rule"], e["device_id"], e["started_at"], e["fired_at"], e["value"]) for e in rows)
