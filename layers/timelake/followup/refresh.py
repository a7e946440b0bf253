"""What follows a publish: rollups refreshed over the published range and, when the job asks for it,
the table's rules evaluated there in historical mode.

One entry per orchestrator: the embedded runner calls `run` as the job's ``refreshing`` phase; on
AWS the EventBridge rule on "Backfill Published" invokes the rollup Lambda once per published chunk,
which cuts the chunk into `pieces` and calls `on_published` for each, one Lambda per piece (through a
work queue) when there are several. Both are idempotent (rollup chunks and backfill events
are replaced, never appended twice), so a retried event or a resumed job is harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

from pydantic import BaseModel

from timelake.followup.rollup import CHUNK, refresh, rollups_of
from timelake.followup.rules import evaluate_published, rules_of
from timelake.model.spec import JobSpec
from timelake.model.timeutil import iso, next_boundary, parse_instant, to_micros
from timelake.ports.runtime import Runtime
from timelake.ports.store import Phase


GRAINS = ("day", "month")  # the rollup chunks, finest first


class PublishedEvent(BaseModel):
    """The detail of a "Backfill Published" event: the range whose rollups (and events) are stale."""

    job_id: str
    table: str
    start: str
    end: str
    evaluate_rules: bool = False


def needed(table: Any, spec: JobSpec) -> bool:
    """Whether a published job has follow-up work (the runner skips the phase otherwise)."""
    return bool(rollups_of(table)) or (spec.evaluate_rules and bool(rules_of(table)))


def pieces(rt: Runtime, event: PublishedEvent) -> list[PublishedEvent]:
    """The event's range cut at the boundaries of its table's largest rollup chunk (a day; a month when
    the table has daily rollups), so each piece refreshes its own chunks and no other piece's: on AWS
    each is one work item, and a published year is 365 pieces of a day's work, not one Lambda's year."""
    grain = max((CHUNK[r.interval] for r in rollups_of(rt.load_table(event.table))), key=GRAINS.index, default="day")
    lo, hi = to_micros(parse_instant(event.start)), to_micros(parse_instant(event.end))
    cuts = [lo]
    while cuts[-1] < hi:
        cuts.append(min(next_boundary(cuts[-1], grain), hi))
    if len(cuts) <= 2:
        return [event]
    return [event.model_copy(update={"start": iso(a), "end": iso(b)}) for a, b in pairwise(cuts)]


def on_published(rt: Runtime, event: PublishedEvent, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Refresh the rollups over the event's range; evaluate the rules there if the job asked.
    ``progress(counts)`` hears how far it has got: rollup chunks swapped in, then the rules as one more."""
    rules = int(event.evaluate_rules)
    chunks = [0]

    def tell(done: int, total: int, doing: str) -> None:
        chunks[0] = total
        if progress:
            progress({"done": done, "total": total + rules, "of": "rollup chunks" + (" and rules" if rules else ""),
                      "doing": doing})

    done: dict[str, Any] = {"rollups": refresh(rt, event.table, event.start, event.end, tell)}
    if event.evaluate_rules:
        tell(chunks[0], chunks[0], "rules")
        lo, hi = to_micros(parse_instant(event.start)), to_micros(parse_instant(event.end))
        spans = [(to_micros(parse_instant(p.start)), to_micros(parse_instant(p.end))) for p in pieces(rt, event)]
        done["events"] = evaluate_published(rt, event.table, event.job_id, lo, hi, spans)
        tell(chunks[0] + 1, chunks[0], "rules")
    return done


def run(rt: Runtime, job_id: str) -> dict[str, Any]:
    """The embedded runner's ``refreshing`` phase, over the job's whole published range."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    event = PublishedEvent(job_id=job_id, table=job.table, start=iso(job.state["range_start"]),
                           end=iso(job.state["range_end"]), evaluate_rules=spec.evaluate_rules)
    done = on_published(rt, event, lambda counts: rt.store.note_progress(job_id, "refresh", counts))
    if "events" in done:
        rt.store.update_job(job_id, Phase.PUBLISHED, rollups_refreshed=done["rollups"], rule_events=done["events"])
    else:
        rt.store.update_job(job_id, Phase.PUBLISHED, rollups_refreshed=done["rollups"])
    return done
