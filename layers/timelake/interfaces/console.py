"""What the CLI and the demo print: a job driven with a progress bar, its report, a canary to judge,
and user errors as one line."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.table import Table as RichTable

from timelake.errors import BackfillError, Interrupted
from timelake.followup.diffview import diff_line, diff_text
from timelake.interfaces.lake import Lake
from timelake.model.report import INTERRUPTED, progress, report_of
from timelake.model.spec import printable
from timelake.ports.store import JobStore
from timelake.runner import run_job
from timelake.steps.canary import AWAITING

console = Console(stderr=True)
out = Console()


def drive(lake: Lake, job_id: str, as_json: bool) -> None:
    """Run the job in this process with a display of its steps; print the report; exit non-zero on failure."""
    cancel = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        """The first Ctrl-C asks the runner to stop at its next unit; a second one stops at once. A
        KeyboardInterrupt raised inside a finalizer is swallowed by Python, so the first must not be one."""
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    error: str | None = None
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with StepDisplay(lake.runtime.store, job_id, enabled=not as_json):
            run_job(lake.runtime, job_id, cancel=cancel)
    except (Interrupted, KeyboardInterrupt):
        print(f"interrupted: job {job_id} can be resumed with: timelake backfill resume {job_id}", file=sys.stderr)
        raise typer.Exit(130) from None
    except BackfillError as exc:
        error = str(exc)
    except ValueError as exc:  # a source that cannot be read or mapped: a dry run reports that the run would fail
        if not lake.runtime.store.get_job(job_id).spec.get("dry_run"):
            raise
        error = str(exc)
    finally:
        signal.signal(signal.SIGINT, previous)
    report = report_of(lake.runtime.store, job_id)
    if as_json:
        out.print_json(json.dumps(report, default=str))
    else:
        print_report(report)
        if report["phase"] == AWAITING and report.get("canary"):
            print_canary(report["canary"], job_id, report["approval_deadline"])
    if report["dry_run"] and (error or report.get("would_fail")):
        print(f"the run would fail: {one_line(error or report['would_fail'])}", file=sys.stderr)
        raise typer.Exit(3)
    if error:
        fail(error)


class StepDisplay:
    """A job's steps as it runs, read from the job store twice a second: on a terminal one bar per step
    (count, rows, rows/s, elapsed, then ETA while it runs), elsewhere (a log, a pipe) one line per step
    as it ends. Either way every step shows, however quickly it went."""

    def __init__(self, store: JobStore, job_id: str, enabled: bool = True, every: float = 0.5) -> None:
        self.store, self.job_id, self.enabled, self.every = store, job_id, enabled, every
        self.live = enabled and console.is_terminal
        self.bar = Progress(TextColumn("{task.description}", table_column=Column(width=8, min_width=8, no_wrap=True)),
                            BarColumn(bar_width=16, table_column=Column(width=16, no_wrap=True)),
                            TextColumn("{task.fields[text]}", table_column=Column(no_wrap=True)),
                            console=console, disable=not self.live)
        self.tasks: dict[str, TaskID] = {}
        self.printed: set[str] = set()
        self.paused: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name=f"timelake-display-{job_id}", daemon=True)

    def __enter__(self) -> StepDisplay:
        if self.enabled:
            self.bar.start()
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.stop.set()
        self.thread.join()
        self._show(final=True)
        self.bar.stop()

    def _poll(self) -> None:
        while not self.stop.wait(self.every):
            self._show()

    def _show(self, final: bool = False) -> None:
        """A display that cannot read the store (a full disk, a locked database) skips a beat: it must
        neither stop the job nor hide the error the job itself then reports."""
        with contextlib.suppress(Exception):
            self.show(final)

    def show(self, final: bool = False) -> None:
        """Update the bars, or print the lines of the steps that ended; ``final``: the run is over (here),
        so a step left running was interrupted, unless another process runs the job."""
        store = self.store
        running = store.running(self.job_id) if final else True
        info = progress(store.get_job(self.job_id), store.units(self.job_id), store.progress_notes(self.job_id), running)
        paused = info.get("paused_until")
        if paused and paused != self.paused:
            console.print(safe(f"paused until {paused} (quiet hours {info['quiet_hours']}); Ctrl-C stops, resume continues"),
                          soft_wrap=True)
        self.paused = paused
        for step in info["steps"]:
            name = step["name"]
            if self.live:
                if name not in self.tasks:
                    self.tasks[name] = self.bar.add_task(name, total=None, text="")
                finished = step["state"] == "done"
                total = step["total"] or (1 if finished else None)
                text = step_text(step | {"state": "done"} if step["state"] == "running" else step, name=False, compact=True)
                room = max(console.width - 28, 20)  # the name and the bar keep their width; the text gives way
                self.bar.update(self.tasks[name], total=total, completed=total if finished else (step["done"] or 0),
                                text=safe(text if len(text) <= room else text[:room - 1] + "…"))
            elif name not in self.printed and (step["state"] != "running" or final):
                self.printed.add(name)
                console.print(safe(step_text(step)), soft_wrap=True)


class ChunkDisplay:
    """Rollup chunks as a table's rollups are built (`timelake table declare`): a bar on a terminal,
    elsewhere one line per rollup table as it is done. Call it as ``progress(done, total, doing)``."""

    def __init__(self) -> None:
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
                            TextColumn("chunks"), TimeElapsedColumn(), console=console, disable=not console.is_terminal)
        self.task: TaskID | None = None
        self.doing: str | None = None
        self.started = time.monotonic()

    def __enter__(self) -> ChunkDisplay:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def __call__(self, done: int, total: int, doing: str) -> None:
        if self.task is None:
            self.task = self.bar.add_task(doing, total=total)
        self.bar.update(self.task, completed=done, description=safe(f"building {doing}"))
        if not console.is_terminal:  # a log gets a line as each rollup table is done
            if self.doing is not None and doing != self.doing:
                self._line(self.doing, done, total)
            if done == total:
                self._line(doing, done, total)
        self.doing = doing

    def _line(self, doing: str, done: int, total: int) -> None:
        console.print(safe(f"built {doing}: {done}/{total} chunks, {duration(time.monotonic() - self.started)}"),
                      soft_wrap=True)


def step_text(step: dict[str, Any], name: bool = True, compact: bool = False) -> str:
    """One step as a line: ``write (running): 3/10 units, 1,200/4,000 rows, 8,000 rows/s, 0.2 s, ETA 0.4 s``;
    a step that is done says only its numbers. ``compact`` (beside a bar): times first, rows shortened."""
    number = _short if compact else (lambda n: f"{n:,}")
    count = rows = rate = None
    if step["total"] is not None or step["done"] is not None:
        count = f"{step['done'] or 0:,}" + (f"/{step['total']:,}" if step["total"] is not None else "")
        count += f" {step['of']}" + (f" ({step['doing']})" if step.get("doing") else "")
    if step["rows"] is not None:
        rows = number(step["rows"]) + (f"/{number(step['rows_total'])}" if step["rows_total"] else "") + " rows"
    if step["rows_per_second"]:
        rate = f"{number(step['rows_per_second'])} rows/s"
    clock = duration(step["elapsed_seconds"])
    eta = f"ETA {duration(step['eta_seconds'])}" if step["eta_seconds"] is not None else None
    parts = [count, clock, eta, rows, rate] if compact else [count, rows, rate, clock, eta]
    text = ", ".join(p for p in parts if p)
    state = "" if step["state"] == "done" else step["state"]
    head = f"{step['name']} ({state})" if name and state else step["name"] if name else state
    return f"{head}: {text}" if head else text


def _short(n: int) -> str:
    """``950``, ``12.3k``, ``4.5M``: a row count beside a bar."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def duration(seconds: float) -> str:
    """``0.4 s``, ``16 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def status_line(info: dict[str, Any]) -> str:
    """A job in one line: its phase, the running step's count, rate and ETA, and what to do next."""
    current = next((s for s in info["steps"] if s["name"] == info["step"]), None)
    if current is not None and info["phase"] != AWAITING:
        where = step_text(current)
    else:
        where = f"{info['units_done']}/{info['units_total']} units, {info['rows_processed']:,}/{info['rows_total']:,} rows"
        where += f", {duration(info['elapsed_seconds'])}"
    phase = f"interrupted in {info['stopped_in']}" if info["phase"] == INTERRUPTED else info["phase"]
    tail = f" — resume with: {info['resume']}" if info.get("resume") else ""
    if info["phase"] == AWAITING:
        tail = f" — approve with: timelake backfill continue {info['job_id']}"
    if info.get("paused_until"):
        tail += f" — paused until {info['paused_until']} (quiet hours {info['quiet_hours']})"
    if info.get("error"):
        tail += f" — {one_line(info['error'])}"
    if "execution" in info:
        tail += f" [execution {info['execution']['status']}]"
    return f"{info['job_id']} {phase}; {where}{tail}"


def print_report(r: dict[str, Any]) -> None:
    """The report as a table a person reads. A value the job never learned (a job that failed before
    reading its source has no time range) is left out rather than shown as ``None``."""
    grid = RichTable(title=safe(f"{r['job_id']} — {r['table']} — {r['phase']}"), show_header=False)
    grid.add_column(style="bold")
    grid.add_column()
    span = r["time_range"] or {}
    rows = [
        ("mode", r["mode"]), ("reason", r.get("reason")), ("source", r["source"]),
        ("time range", f"{span['min']} … {span['max']}" if span.get("min") else None),
        ("rows in source", r["rows_in_source"]), ("rows written", r["rows_written"]),
        ("rows replaced", r["rows_replaced"] if r["mode"] == "replace" else None),
        ("duplicates in source", r["rows_duplicate_in_source"]), ("conflicting existing", r["rows_conflicting_existing"]),
        ("overlap with existing", r["overlap_existing_rows"]), ("outside retention", r["rows_outside_retention"]),
        ("outside range", r["rows_outside_range"]), ("rejected", json.dumps(r["rows_rejected"]["reasons"])),
        *_issue_rows("rejected", r["rows_rejected"].get("by_column", {})),
        ("values nulled", f"{r['values_nulled']['total']:,}" if r.get("values_nulled", {}).get("total") else None),
        *_issue_rows("nulled", r.get("values_nulled", {}).get("by_column", {})),
        (f"states in {(r.get('states') or {}).get('column')}", _states(r.get("states"))),
        ("reject budget", _budget(r.get("reject_budget"))),
        ("units / files", f"{r['units']} / {r['files']}"),
        ("source gaps", ", ".join(f"{g['start']}…{g['end']}" for g in r["source_gaps"][:5]) or "none"),
        ("estimated cost", _cost(r["estimated_cost"])),
        ("source limits", _source_limits(r["source_limits"])),
        ("quiet hours", _quiet(r.get("quiet_hours"))),
        ("settings changed", "; ".join(", ".join(f"{k} {v:,}" for k, v in change.items() if k != "at")
                                       for change in r.get("settings_changes", [])) or None),
        ("diff" + (" (predicted)" if r["dry_run"] else ""), diff_line(r["diff"]) if r.get("diff") else None),
        ("published snapshots", ", ".join(map(str, r["published_snapshot_ids"])) or "none"),
        ("elapsed", duration(r["elapsed_seconds"])),
    ]
    for key, value in rows:
        if value is not None:
            grid.add_row(key, safe(value))
    for step in r["steps"]:
        grid.add_row(f"  {step['name']}", safe(step_text(step, name=False)))
    for check in r["checks"]:
        mark = "[green]pass[/]" if check["passed"] else ("[red]FAIL[/]" if check["blocking"] else "[yellow]warn[/]")
        grid.add_row(f"check {check['name']}", f"{mark} {safe(check['detail'])}")
    out.print(grid)


def _quiet(quiet: dict[str, Any] | None) -> str | None:
    if not quiet:
        return None
    paused = f", paused until {quiet['paused_until']}" if quiet["paused_until"] else ""
    return f"{quiet['window']}{paused}; {quiet['pauses']} pause(s), {duration(quiet['paused_seconds'])} in all"


def _issue_rows(action: str, by_column: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """One report row per column: its kinds of rejected or nulled values, the most first, with an example
    and the option that reads them."""
    rows = []
    for column, kinds in by_column.items():
        parts = []
        for kind, entry in kinds.items():
            example = f" e.g. {entry['examples'][0]}" if entry["examples"] else ""
            fix = f" ({entry['fix']})" if entry.get("fix") else ""
            parts.append(f"{entry['rows']:,} {kind.replace('_', ' ')}{example}{fix}")
        rows.append((f"  {action} in {column}", "; ".join(parts)))
    return rows


def _states(states: dict[str, Any] | None) -> str | None:
    if not states:
        return None
    counts = sorted(states["counts"].items(), key=lambda item: -item[1])
    return f"{states['rows']:,}: " + ", ".join(f"{name} {rows:,}" for name, rows in counts[:10]) + (
        " …" if len(counts) > 10 else "") if counts else "none"


def _budget(budget: dict[str, Any] | None) -> str | None:
    if not budget:
        return None
    limit = f"{budget['limit']} = {budget['allowed']:,} rows" if isinstance(budget["limit"], str) else f"{budget['allowed']:,} rows"
    verdict = "within" if budget["passed"] else "OVER"
    return f"{budget['counted']:,} rejected or nulled, {verdict} the budget of {limit}"


def print_canary(c: dict[str, Any], job_id: str, deadline: str | None) -> None:
    """The canary day as a person judges it: its rejects first, then counts, rows through the mapping,
    columns, projections. Tables fold long values onto more lines rather than cut them."""
    budget = c.get("reject_budget")
    whole = f"; whole job: {_budget(budget)}" if budget else ""
    out.print(f"[bold]canary {c['day']}[/]: {c.get('rows_rejected_on_day', 0):,} rows of the day rejected or nulled{whole}")
    if c.get("rejected_samples"):
        rejected = _grid("where", "source row", "why", title="rejected rows of the day")
        for s in c["rejected_samples"]:
            rejected.add_row(safe(s["origin"]), safe(_row_text(s["source"])), safe(s["reason"]))
        out.print(rejected)
    out.print(f"[bold]canary {c['day']}[/] ({c['range']['start']} … {c['range']['end']}): {c['rows_in_source']:,} rows in, "
              f"{c['rows_written']:,} staged, {c['rows_duplicate_in_source']:,} duplicates, "
              f"{c['rows_conflicting_existing']:,} conflicting existing; {c['units']} unit(s), {c['files']} file(s)")
    samples = _grid("where", "source row", "mapped row (UTC)", "existing row on main", "outcome", title="sample rows")
    for s in c["samples"]:
        samples.add_row(safe(s["origin"]), safe(_row_text(s["source"])), safe(_row_text(s["mapped"])),
                        safe(_row_text(s["existing"])), s["outcome"])
    out.print(samples)
    columns = _grid("column", "source min", "source max", "source nulls", "staged min", "staged max", "staged nulls",
                    title="columns, source rows of the day vs staged")
    for col in c["columns"]:
        src, staged = col["source"], col["staged"]
        columns.add_row(col["column"], *(str(x) for x in (src["min"], src["max"], src["nulls"], staged["min"], staged["max"], staged["nulls"])))
    out.print(columns)
    if c.get("diff"):
        out.print(f"what the day changes on main: {diff_line(c['diff'])}", soft_wrap=True)
        out.print(diff_text(c["diff"], days=True), end="", soft_wrap=True)
    p = c["projected"]
    speed = f"; {p['canary_rows_per_second']:,} rows/s in the canary" if p["canary_rows_per_second"] else ""
    out.print(f"whole job: {p['rows_in_scope']:,} rows in scope, ~{p['rows_written']:,} to write, {p['units']} unit(s) / "
              f"{p['files']} file(s), {_cost(p['estimated_cost'])}{speed}")
    out.print(f"approve with: timelake backfill continue {job_id}    drop it with: timelake backfill abort {job_id}")
    if deadline:
        out.print(f"approve before {deadline}: after that the job is aborted")


def _grid(*headers: str, title: str) -> RichTable:
    return RichTable(*(Column(h, overflow="fold") for h in headers), title=title)


def _row_text(row: dict[str, Any] | None) -> str:
    return "—" if row is None else ", ".join(f"{k}={v}" for k, v in row.items())


def _cost(cost: dict[str, Any] | None) -> str:
    if not cost:
        return "n/a"
    return f"~{cost['local_wall_seconds']} s here on {cost['local_cores']} core(s); ~${cost['aws_usd']:.4f} on AWS"


def _source_limits(limits: dict[str, Any]) -> str:
    connections = limits["max_connections"] or "no limit on"
    rate = f"{limits['rows_per_second']:,} rows/s" if limits["rows_per_second"] else "no rate limit"
    eta = f", read ETA ~{limits['read_eta_seconds']} s" if limits["read_eta_seconds"] is not None else ""
    return f"{connections} connection(s), {rate}{eta}"


def fail(message: str) -> NoReturn:
    print(f"error: {one_line(message)}", file=sys.stderr)
    raise typer.Exit(1)


def one_line(message: str) -> str:
    """One line without control characters: error text may quote a source cell or a file name."""
    return " ".join(printable(message).split())


def safe(value: Any) -> str:
    """User text for a Rich console: no control characters, and no ``[...]`` taken for markup."""
    return escape(printable(str(value)))


def print_table(headers: list[str], rows: list[list[Any]], empty: str) -> None:
    """Rows as a table a person reads, or, when stdout is not a terminal, as plain tab-separated
    columns a script reads. Either way no cell is cut: a job id is copied from here."""
    if not rows:
        out.print(empty)
        return
    if not out.is_terminal:
        print("\t".join(headers))
        for row in rows:
            print("\t".join(safe(cell) for cell in row))
        return
    cells = [[safe(cell) for cell in row] for row in rows]
    grid = RichTable(*headers)
    for i, column in enumerate(grid.columns):
        column.no_wrap = True
        column.min_width = max(len(headers[i]), *(len(row[i]) for row in cells))
    for row in cells:
        grid.add_row(*row)
    width = sum((column.min_width or 0) + 3 for column in grid.columns) + 1  # each set just above
    out.print(grid, crop=False, width=max(width, out.width))
