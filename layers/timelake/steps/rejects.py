"""The reject budget: how many source rows a job may leave out or null before it refuses to publish.

A historian export that loads with a third of its values rejected is worse than one that fails: every
check passes and the table is quietly wrong. So rows rejected (bad values, rows without a time or a
series key) and values turned null by ``--on-bad-value null`` are counted against a budget, by
default 0.1 % of the source rows when the job accepts bad values at all and 0 when it does not. Over
it, the job fails before its lease is taken (nothing written, main untouched), and the dry run
predicts exactly that; the message names the largest kinds per column, with examples and the option
that would read them. Rows a DST policy drops or folds were asked for, and do not count.
"""

from __future__ import annotations

import math
from typing import Any, Final

from timelake.model.spec import JobSpec
from timelake.model.issues import Issues
from timelake.ports.store import JobState

DEFAULT_PERCENT = "0.1%"
NOT_COUNTED = {"dst_nonexistent", "dst_ambiguous", "dst_collapsed"}  # a DST policy's own choice
TOP_KINDS = 3  # kinds named per column in a message
CHECK: Final = "reject_budget"


def counted(kind: str) -> bool:
    return kind not in NOT_COUNTED


def budget(spec: JobSpec, rows_in_source: int, issues: Issues) -> dict[str, Any]:
    """The job's budget and what the source used of it."""
    limit = spec.max_rejected if spec.max_rejected is not None else (
        DEFAULT_PERCENT if spec.on_bad_value in ("null", "reject") else 0)
    allowed = limit if isinstance(limit, int) else math.floor(float(limit.rstrip("%")) / 100 * rows_in_source)
    used = issues.rows(kinds=counted)
    return {"limit": limit, "default": spec.max_rejected is None, "allowed": allowed, "counted": used,
            "rejected": issues.rows("rejected", counted), "nulled": issues.rows("nulled", counted),
            "rows_in_source": rows_in_source, "passed": used <= allowed}


def failure(budget: dict[str, Any], issues: Issues) -> str | None:
    """Why the job fails its budget (None: it does not): counts, the budget, and per column the largest
    kinds with examples and the option that reads them."""
    b = budget
    if b["passed"]:
        return None
    share = f"{100 * b['counted'] / b['rows_in_source']:.3g} %" if b["rows_in_source"] else "all"
    limit = f"{b['limit']}" if isinstance(b["limit"], str) else f"{b['limit']:,} rows"
    how = "the default budget" if b["default"] else "the budget"
    return (f"{b['counted']:,} of {b['rows_in_source']:,} source rows ({share}) were rejected or had a value nulled, "
            f"over {how} of {limit} ({b['allowed']:,} rows; --max-rejected sets it): {describe(issues)}")


def describe(issues: Issues) -> str:
    """Per column, its largest kinds of rejected or nulled rows, each with examples and its fix."""
    parts = []
    for action in ("rejected", "nulled"):
        for column, kinds in issues.by_column(action).items():
            shown = [(kind, entry) for kind, entry in kinds.items() if counted(kind)][:TOP_KINDS]
            for kind, entry in shown:
                fix = f" — {entry['fix']}" if entry.get("fix") else ""
                parts.append(f"column '{column}': {entry['rows']:,} {action}, {kind.replace('_', ' ')}, "
                             f"e.g. {', '.join(entry['examples'])}{fix}")
    return "; ".join(parts)


def check(state: JobState) -> dict[str, Any] | None:
    """The budget as a validation check (the fields of `validate.Check`), from a job's state; None for a
    job planned before the budget existed."""
    b = state.get(CHECK)
    if b is None:
        return None
    limit = f"{b['limit']} = {b['allowed']:,} rows" if isinstance(b["limit"], str) else f"{b['allowed']:,} rows"
    detail = (f"{b['counted']:,} of {b['rows_in_source']:,} source rows rejected or nulled "
              f"({b['rejected']:,} rejected, {b['nulled']:,} nulled); budget {limit}")
    failed = failure(b, Issues.from_json(state.get("value_issues", [])))
    return {"name": CHECK, "passed": b["passed"], "detail": failed or detail, "blocking": True, "samples": []}
