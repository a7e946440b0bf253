"""Pictures of a job's diff (`timelake.model.diff`): a line for the report, text for the terminal and a
standalone HTML page, the same facts in each.

The page draws one cell per series and day, as the coverage heatmap draws one per bucket: grey where
the day's rows are the same before and after, green where the job adds the series' day, red where it
removes it, orange (deeper as more of its rows differ) where it changes some of it; beside it the
columns' sums and counts before and after, the days, and sample rows side by side.
"""

from __future__ import annotations

import html
import json
from datetime import date, timedelta
from typing import Any

import pyarrow as pa
from rich.text import Text

KIND_NAMES = {"changed": "changed", "only_before": "only before", "only_after": "only after"}
STATES = {"same": "#9aa0a6", "added": "#2a9d3a", "removed": "#d33", "changed": "#e3801a"}
DAYS_SHOWN = 31  # days the text lists, the most changed first
SAMPLES_SHOWN = 5  # sample rows of each kind the text shows (the JSON and the page have every day's)


def diff_line(d: dict[str, Any]) -> str:
    """A diff in one line: the rows on each side and how they meet, and each column's sum and count delta."""
    t = d["totals"]
    share = f" ({t['changed'] / t['in_both']:.1%})" if t["in_both"] else ""
    parts = [f"{t['rows_before']:,} rows before, {t['rows_after']:,} after: {t['only_before']:,} only before, "
             f"{t['only_after']:,} only after, {t['in_both']:,} in both, {t['changed']:,} changed{share}"]
    for c in d["by_column"]:
        parts.append(f"{c['column']}: sum {_signed(c['sum_delta'])}, count {c['count_delta']:+,}, {c['changed']:,} changed")
    return "; ".join(parts)


def diff_text(d: dict[str, Any], days: bool = True) -> Text:
    """The diff as a person reads it in a terminal: totals, per column, per day (the most changed first),
    the most changed series and the sample rows, before and after side by side."""
    text = Text()
    t = d["totals"]
    text.append(f"  rows: {t['rows_before']:,} before, {t['rows_after']:,} after — {t['only_before']:,} only before, "
                f"{t['only_after']:,} only after, {t['in_both']:,} in both ({t['changed']:,} changed, "
                f"{t['unchanged']:,} unchanged)\n")
    text.append(_grid(["column", "sum before", "sum after", "Δ sum", "count before", "count after", "Δ count", "changed", "match"],
                      [[c["column"], _number(c["sum_before"]), _number(c["sum_after"]), _signed(c["sum_delta"]),
                        f"{c['count_before']:,}", f"{c['count_after']:,}", f"{c['count_delta']:+,}", f"{c['changed']:,}",
                        "—" if c["match_share"] is None else f"{c['match_share']:.1%}"] for c in d["by_column"]]))
    first = d["by_column"][0]["column"] if d["by_column"] else None
    if days and d["by_day"]:
        shown = sorted(d["by_day"], key=lambda g: -_score(g))[:DAYS_SHOWN]
        shown.sort(key=lambda g: g["day"])
        title = f"  days ({len(shown)} of {len(d['by_day'])}, the most changed)" if len(shown) < len(d["by_day"]) else "  days"
        text.append(title + ":\n")
        text.append(_grid(["day", *_COUNT_HEADS] + ([f"Δ sum({first})"] if first else []),
                          [[g["day"], *_counts(g)] + ([_signed(g["columns"][first]["sum_delta"])] if first else []) for g in shown]))
    if d.get("by_series"):
        text.append(f"  series ({len(d['by_series'])} of {d['series_total']:,}, the most changed first):\n")
        text.append(_grid(["series", *_COUNT_HEADS] + ([f"Δ sum({first})"] if first else []),
                          [[g["series"] or "(all)", *_counts(g)] + ([_signed(g["columns"][first]["sum_delta"])] if first else [])
                           for g in d["by_series"]]))
    samples = [(kind, s) for kind in KIND_NAMES for s in d["samples"].get(kind, [])[:SAMPLES_SHOWN]]
    if samples:
        text.append("  sample rows, before → after:\n")
        for kind, s in samples:
            key = " ".join(f"{k}={v}" for k, v in s["key"].items())
            columns = list((s["before"] or s["after"] or {}).keys())
            values = ", ".join(f"{c}: {_value(s['before'], c)} → {_value(s['after'], c)}" for c in columns)
            text.append(f"    {KIND_NAMES[kind]:<12} {key}  {values}\n")
    return text


_COUNT_HEADS = ["before", "after", "only before", "only after", "in both", "changed"]


def _counts(g: dict[str, Any]) -> list[str]:
    return [f"{g[k]:,}" for k in ("rows_before", "rows_after", "only_before", "only_after", "in_both", "changed")]


def _score(g: dict[str, Any]) -> int:
    return g["only_before"] + g["only_after"] + g["changed"]


def _grid(heads: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, the first left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]

    def line(cells: list[str]) -> str:
        return "    " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + "\n"

    return line(heads) + "".join(line(r) for r in rows)


def _number(value: Any) -> str:
    return f"{value:,.10g}" if isinstance(value, float) else str(value)


def _signed(value: Any) -> str:
    return f"{value:+,.10g}" if isinstance(value, float) else str(value)


def _value(side: dict[str, Any] | None, column: str) -> str:
    return "—" if side is None else str(side.get(column))


def cell_state(cell: dict[str, Any]) -> tuple[str, int]:
    """A cell's state on the page (same, added, removed, changed) and its shade 1..4: the share of its
    rows that differ (only one side holds them, or their values changed)."""
    before, after = cell["rows_before"], cell["rows_after"]
    differing = cell["only_before"] + cell["only_after"] + cell["changed"]
    if before == 0:
        return "added", 4
    if after == 0:
        return "removed", 4
    if differing == 0:
        return "same", 1
    return "changed", max(1, min(4, -(-4 * differing // max(before, after))))


def page(d: dict[str, Any], cells: pa.Table | None) -> str:
    """A standalone HTML page (inline CSS and script, no external assets) whose script draws one
    ``.cell`` element per series and day from the embedded JSON: the grid holds the most changed series
    of the summary, so the data stays machine-readable and the page small however long the job."""
    shown = [g["series"] for g in d.get("by_series", [])]
    grid = []
    if cells is not None and cells.num_rows:
        wanted = set(shown)
        for cell in cells.to_pylist():
            if cell["series"] in wanted:
                state, level = cell_state(cell)
                grid.append({"day": cell["day"].isoformat(), "series": cell["series"], "state": state, "level": level,
                             **{k: cell[k] for k in ("rows_before", "rows_after", "only_before", "only_after", "in_both", "changed")}})
    start, end = d["range"]["start"][:10], d["range"]["end"]
    last = date.fromisoformat(end[:10]) - (timedelta(days=1) if end[10:] in ("", "T00:00:00Z") else timedelta(0))
    days = [(date.fromisoformat(start) + timedelta(days=i)).isoformat() for i in range((last - date.fromisoformat(start)).days + 1)]
    data = {**d, "grid": grid, "grid_series": shown, "days": days, "states": STATES}
    payload = json.dumps(data).replace("</", "<\\/")
    scope = "canary day of " if d.get("scope") == "canary" else ""
    title = html.escape(f"diff of {scope}job {d['job_id']} on {d['table']} ({d['mode']})" + (" — predicted" if d.get("predicted") else ""))
    return _PAGE.replace("{title}", title).replace("{payload}", payload)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin-top: 22px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
td:first-child, th:first-child { text-align: left; }
.grid { display: grid; grid-template-columns: max-content 1fr; gap: 2px 10px; align-items: center; overflow-x: auto; }
.cells { display: flex; gap: 2px; }
.cell, .swatch { display: inline-block; width: 14px; height: 14px; border-radius: 2px; box-sizing: border-box; }
.head { width: 14px; font-size: 9px; color: #888; text-align: center; overflow: visible; }
.cell.empty { background: transparent; border: 1px dashed #ddd; }
.cell.same { background: #9aa0a6; } .cell.added { background: #2a9d3a; } .cell.removed { background: #d33; }
.cell.changed { background: #e3801a; }
.cell.l1 { opacity: .4; } .cell.l2 { opacity: .6; } .cell.l3 { opacity: .8; } .cell.l4 { opacity: 1; }
.legend { margin: 12px 0; display: flex; gap: 16px; align-items: center; }
.legend span { display: inline-flex; gap: 6px; align-items: center; }
.label { color: #555; white-space: nowrap; }
.before { color: #b00; } .after { color: #070; }
</style></head>
<body>
<h1>{title}</h1>
<p id="summary"></p>
<h2>columns</h2><table id="columns"></table>
<h2>series by day</h2>
<div class="legend" id="legend"></div>
<div class="grid" id="grid"></div>
<h2>days</h2><table id="days"></table>
<h2>sample rows, before and after</h2><table id="samples"></table>
<script type="application/json" id="diff-data">{payload}</script>
<script>
const data = JSON.parse(document.getElementById("diff-data").textContent);
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; };
const n = (v) => typeof v === "number" ? v.toLocaleString("en") : String(v);
const t = data.totals;
document.getElementById("summary").textContent =
  `${data.range.start} … ${data.range.end}: ${n(t.rows_before)} rows before, ${n(t.rows_after)} after; `
  + `${n(t.only_before)} only before, ${n(t.only_after)} only after, ${n(t.in_both)} in both, ${n(t.changed)} changed`
  + (data.reason ? `. Reason: ${data.reason}` : "");
const row = (table, cells, head) => { const tr = el("tr"); for (const c of cells) tr.append(el(head ? "th" : "td", "", c)); table.append(tr); };
const columns = document.getElementById("columns");
row(columns, ["column", "sum before", "sum after", "Δ sum", "count before", "count after", "Δ count", "changed", "match"], true);
for (const c of data.by_column) row(columns, [c.column, n(c.sum_before), n(c.sum_after), n(c.sum_delta), n(c.count_before),
  n(c.count_after), n(c.count_delta), n(c.changed), c.match_share === null ? "—" : (100 * c.match_share).toFixed(1) + " %"]);
const legend = document.getElementById("legend");
for (const [state, label] of [["same", "same"], ["changed", "values or rows differ (deeper: more of them)"], ["added", "only after"], ["removed", "only before"]]) {
  const item = el("span"); item.append(el("i", `swatch cell ${state} l4`), label); legend.append(item);
}
const grid = document.getElementById("grid");
if (data.grid_series.length) {
  const head = el("div", "cells");
  for (const day of data.days) { const h = el("div", "head", day.slice(8)); h.title = day; head.append(h); }
  grid.append(el("div"), head);
}
const byKey = new Map(data.grid.map((c) => [`${c.series}\\u0000${c.day}`, c]));
for (const series of data.grid_series) {
  grid.append(el("div", "label", series || "(all)"));
  const cells = el("div", "cells");
  for (const day of data.days) {
    const c = byKey.get(`${series}\\u0000${day}`);
    if (!c) { const e = el("div", "cell empty"); e.dataset.day = day; e.dataset.series = series; e.dataset.state = "empty"; cells.append(e); continue; }
    const e = el("div", `cell ${c.state} l${c.level}`);
    e.dataset.day = day; e.dataset.series = series; e.dataset.state = c.state;
    e.title = `${series} ${day}: ${c.rows_before} before, ${c.rows_after} after; ${c.only_before} only before, ${c.only_after} only after, ${c.in_both} in both, ${c.changed} changed`;
    cells.append(e);
  }
  grid.append(cells);
}
const days = document.getElementById("days");
row(days, ["day", "before", "after", "only before", "only after", "in both", "changed"], true);
for (const g of data.by_day) row(days, [g.day, n(g.rows_before), n(g.rows_after), n(g.only_before), n(g.only_after), n(g.in_both), n(g.changed)]);
const samples = document.getElementById("samples");
row(samples, ["kind", "key", "before", "after"], true);
const side = (values) => values ? Object.entries(values).map(([k, v]) => `${k}=${v}`).join(", ") : "—";
for (const [kind, label] of [["changed", "changed"], ["only_before", "only before"], ["only_after", "only after"]]) {
  for (const s of data.samples[kind] || []) {
    const tr = el("tr");
    tr.append(el("td", "", label), el("td", "", Object.entries(s.key).map(([k, v]) => `${k}=${v}`).join(" ")),
              el("td", "before", side(s.before)), el("td", "after", side(s.after)));
    samples.append(tr);
  }
}
</script>
</body></html>
"""
