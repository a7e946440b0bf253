"""Pictures of a coverage map: a calendar heatmap for the terminal (rich) and a standalone HTML page.

Both draw the same grid, so a person reading a terminal and one opening the page see one picture:
day buckets as one row per month (a cell per day of the month), hour buckets as one row per day (a
cell per hour), month buckets as one row per year. Colour is the status, shade is rows in the bucket
(relative to the expected rows when a cadence is declared, else to the busiest bucket).
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone

from rich.text import Text

from timelake.followup.coverage import Bucket, CoverageMap

SHADES = "░▒▓█"
SERIES_SHOWN = 20
COLOURS = {"complete": "green", "partial": "yellow", "has_data": "cyan", "backfilling": "blue", "gap": "red"}
_LAYOUT = {  # grain → (row label format, columns, column of a bucket start)
    "day": ("%Y-%m", 31, lambda d: d.day - 1),
    "hour": ("%Y-%m-%d", 24, lambda d: d.hour),
    "month": ("%Y", 12, lambda d: d.month - 1),
}
_HEADERS = {"day": [str(d) for d in range(1, 32)], "hour": [f"{h:02d}" for h in range(24)],
            "month": ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]}


def rows_of(cmap: CoverageMap) -> list[tuple[str, list[Bucket | None]]]:
    """The grid: (row label, one slot per column, None where the calendar has no bucket in range)."""
    fmt, width, column = _LAYOUT[cmap.by]
    grid: dict[str, list[Bucket | None]] = {}
    for b in cmap.buckets:
        start = datetime.fromtimestamp(b.start / 1e6, timezone.utc)
        grid.setdefault(start.strftime(fmt), [None] * width)[column(start)] = b
    return list(grid.items())


def level(b: Bucket, busiest: int) -> int:
    """Shade 1..4 (0: no rows)."""
    scale = b.expected or busiest
    if not b.rows or not scale:
        return 0
    return max(1, min(4, -(-4 * b.rows // scale)))


def terminal(cmap: CoverageMap) -> Text:
    """The calendar heatmap with a legend and the gap/backfilling ranges spelled out."""
    text = Text()
    if not cmap.buckets:
        return text.append(f"  {cmap.table}: no data files{' in range' if cmap.start else ''}\n")
    busiest = max(b.rows for b in cmap.buckets)
    _, width, _ = _LAYOUT[cmap.by]
    for label, slots in rows_of(cmap):
        text.append(f"  {label:>10} │")
        for b in slots:
            if b is None:
                text.append(" ")
            elif b.status == "gap":
                text.append("·", style=COLOURS["gap"])
            else:
                text.append(SHADES[max(level(b, busiest), 1) - 1], style=COLOURS[b.status])
        total = sum(b.rows for b in slots if b is not None)
        text.append(f"│ {total:>12,} rows\n")
    counts = cmap.counts()
    scale = "of the expected rows" if cmap.expected_interval and cmap.expected_series else f"of {busiest:,} rows"
    text.append(f"  legend: one cell per {cmap.by}; shade {SHADES} = up to ¼ ½ ¾ all {scale}\n  ")
    for status, colour in COLOURS.items():
        text.append("·" if status == "gap" else SHADES[-1], style=colour).append(f" {status.replace('_', ' ')} {counts[status]}  ")
    text.append("\n")
    for status in ("gap", "backfilling", "partial"):
        spans = _spans([b for b in cmap.buckets if b.status == status])
        if spans:
            text.append(f"  {status}: ", style=COLOURS[status]).append("; ".join(spans[:8]) + (" …" if len(spans) > 8 else "") + "\n")
    if any(b.series is not None for b in cmap.buckets):
        text.append(_series_lines(cmap))
    return text


def _series_lines(cmap: CoverageMap) -> Text:
    """Per series: rows in range and the buckets where it has no rows (what a per-series gap looks like)."""
    names = sorted({s for b in cmap.buckets for s in (b.series or {})})
    gaps = {name: [b for b in cmap.buckets if not (b.series or {}).get(name)] for name in names}
    shown = sorted(names, key=lambda n: (-len(gaps[n]), n))[:SERIES_SHOWN]  # the most incomplete first
    text = Text(f"  {len(names)} series seen" + (f", the {SERIES_SHOWN} most incomplete (all in --json)" if len(names) > SERIES_SHOWN else "") + ":\n")
    for name in shown:
        missing = gaps[name]
        rows = sum((b.series or {}).get(name, 0) for b in cmap.buckets)
        text.append(f"    {name:<20} {rows:>12,} rows")
        if missing:
            spans = _spans(missing)
            text.append(f"  missing in {len(missing)} {cmap.by}(s): ", style="red").append("; ".join(spans[:4]) + (" …" if len(spans) > 4 else ""))
        text.append("\n")
    return text


def _spans(buckets: list[Bucket]) -> list[str]:
    """Consecutive buckets joined into ranges: ``2024-03-01…2024-03-30 (30)``, with the backfill job if any."""
    spans: list[list[Bucket]] = []
    for b in buckets:
        if spans and spans[-1][-1].end == b.start and spans[-1][-1].backfill_jobs == b.backfill_jobs:
            spans[-1].append(b)
        else:
            spans.append([b])
    result = []
    for run in spans:
        jobs = f" job {', '.join(run[0].backfill_jobs)}" if run[0].backfill_jobs else ""
        result.append((f"{run[0].label}…{run[-1].label} ({len(run)})" if len(run) > 1 else run[0].label) + jobs)
    return result


def page(cmap: CoverageMap) -> str:
    """A standalone HTML page (inline CSS and script, no external assets); its script draws one
    ``.cell.<status>`` element per bucket from the embedded JSON, so the data is also machine-readable."""
    busiest = max((b.rows for b in cmap.buckets), default=0)
    data = {**cmap.to_dict(), "grid": [[label, [None if b is None else {
        "bucket": b.label, "rows": b.rows, "expected": b.expected, "status": b.status, "level": level(b, busiest),
        "writers": b.writers, "jobs": b.backfill_jobs, "estimated": b.estimated} for b in slots]]
        for label, slots in rows_of(cmap)] if cmap.buckets else [], "columns": _HEADERS[cmap.by]}
    payload = json.dumps(data).replace("</", "<\\/")
    title = html.escape(f"coverage of {cmap.table} by {cmap.by}")
    return _PAGE.replace("{title}", title).replace("{payload}", payload)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 18px; }
.grid { display: grid; grid-template-columns: max-content 1fr max-content; gap: 3px 10px; align-items: center; }
.cells { display: flex; gap: 2px; }
.cell, .swatch { display: inline-block; width: 14px; height: 14px; border-radius: 2px; box-sizing: border-box; }
.cell.pad { background: transparent; }
.head { width: 14px; font-size: 9px; color: #888; text-align: center; overflow: visible; }
.gap { background: #fff; border: 1px solid #d33; }
.complete { background: #2a9d3a; }
.partial { background: #e3a21a; }
.has_data { background: #2a8c9d; }
.backfilling { background: #3166d6; background-image: repeating-linear-gradient(45deg, transparent 0 3px, rgba(255,255,255,.45) 3px 5px); }
.cell.l1 { opacity: .4; } .cell.l2 { opacity: .6; } .cell.l3 { opacity: .8; } .cell.l4 { opacity: 1; }
.label, .total { font-variant-numeric: tabular-nums; color: #555; }
.legend { margin: 16px 0; display: flex; gap: 16px; align-items: center; }
.legend span { display: inline-flex; gap: 6px; align-items: center; }
</style></head>
<body>
<h1>{title}</h1>
<p id="summary"></p>
<div class="legend" id="legend"></div>
<div class="grid" id="grid"></div>
<script type="application/json" id="coverage-data">{payload}</script>
<script>
const data = JSON.parse(document.getElementById("coverage-data").textContent);
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; };
const s = data.statuses;
document.getElementById("summary").textContent = data.buckets.length
  ? `${data.start} … ${data.end}: ${data.rows.toLocaleString("en")} rows; ${s.complete} complete, ${s.partial} partial, ${s.has_data} with data (no expected count), ${s.backfilling} backfilling, ${s.gap} gap`
    + (data.expected_interval ? (data.expected_series != null
        ? ` (expected: one row every ${data.expected_interval} for each of ${data.expected_series} series)`
        : ` (cadence ${data.expected_interval}; series count unknown: set timelake.expected-series or use --series)`) : "")
  : "no data files";
const legend = document.getElementById("legend");
for (const status of ["complete", "partial", "has_data", "backfilling", "gap"]) {
  const item = el("span");
  item.append(el("i", `swatch ${status}`), `${status.replace("_", " ")} (${s[status]})`);
  legend.append(item);
}
legend.append(el("span", "", "shade: rows in the bucket"));
const grid = document.getElementById("grid");
if (data.grid.length) {
  const head = el("div", "cells");
  for (const c of data.columns) head.append(el("div", "head", c));
  grid.append(el("div"), head, el("div"));
}
for (const [label, slots] of data.grid) {
  grid.append(el("div", "label", label));
  const cells = el("div", "cells");
  let total = 0;
  for (const b of slots) {
    if (!b) { cells.append(el("div", "cell pad")); continue; }
    total += b.rows;
    const cell = el("div", `cell ${b.status} l${b.level}`);
    cell.dataset.bucket = b.bucket; cell.dataset.rows = b.rows; cell.dataset.status = b.status;
    const writers = Object.entries(b.writers).map(([w, n]) => `${w}: ${n}`).join(", ");
    cell.title = `${b.bucket}: ${b.status}, ${b.rows} rows` + (b.expected != null ? ` of ${b.expected} expected` : "")
      + (writers ? `; ${writers}` : "") + (b.jobs.length ? `; backfill ${b.jobs.join(", ")}` : "") + (b.estimated ? " (estimated)" : "");
    cells.append(cell);
  }
  grid.append(cells, el("div", "total", `${total.toLocaleString("en")} rows`));
}
</script>
</body></html>
"""
