"""Rows a job left out and values it nulled, per column and kind: the tally behind the reject budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ISSUE_EXAMPLES = 3  # distinct examples kept per column and kind


class Issues:
    """Rows rejected and values nulled, per column and kind of problem, each with a few distinct examples
    and the option that would read them: what a person needs to see why rows are missing, and how many.

    A kind is what the values look like ("thousands separator", "text", "timestamp format") or, for a row
    left out for another reason, that reason ("null_time", "dst_nonexistent"). Merges add up, so the
    tallies of every batch and scan task combine into the job's."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str], dict[str, Any]] = {}

    def add(self, action: str, column: str, kind: str, rows: int, examples: list[str], fix: str | None = None) -> None:
        entry = self.entries.setdefault((action, column, kind), {"rows": 0, "examples": [], "fix": None})
        entry["rows"] += rows
        for example in examples:
            if len(entry["examples"]) < ISSUE_EXAMPLES and _value(example) not in map(_value, entry["examples"]):
                entry["examples"].append(example)
        entry["fix"] = entry["fix"] or fix

    def merge(self, other: "Issues") -> None:
        for (action, column, kind), entry in other.entries.items():
            self.add(action, column, kind, entry["rows"], entry["examples"], entry["fix"])

    def rows(self, action: str | None = None, kinds: Callable[[str], bool] = lambda kind: True) -> int:
        return sum(e["rows"] for (a, _, k), e in self.entries.items() if (action is None or a == action) and kinds(k))

    def to_json(self) -> list[dict[str, Any]]:
        return [{"action": a, "column": c, "kind": k, **e} for (a, c, k), e in self.entries.items()]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> "Issues":
        issues = cls()
        for e in data:
            issues.add(e["action"], e["column"], e["kind"], e["rows"], e["examples"], e.get("fix"))
        return issues

    def by_column(self, action: str) -> dict[str, dict[str, dict[str, Any]]]:
        """``{column: {kind: {rows, examples, fix}}}`` of one action, the most rows first: the report's shape."""
        found: dict[str, dict[str, dict[str, Any]]] = {}
        for (a, column, kind), entry in sorted(self.entries.items(), key=lambda item: -item[1]["rows"]):
            if a == action:
                found.setdefault(column, {})[kind] = dict(entry)
        return found


def _value(example: str) -> str:
    """The value an example shows, without where it is (``'#ERR' (line 4 of a.csv)``): one example a value."""
    return example.rsplit(" (", 1)[0] if example.endswith(")") else example
