"""What the CLI and the demo print: a job driven with a progress bar, its report, a canary to judge,
and user errors as one line."""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table as RichTable

from timelake.errors import BackfillError, Interrupted
from timelake.interfaces.lake import Lake
from timelake.model.report import build_report
from timelake.model.spec import printable
from timelake.runner import run_job
from timelake.steps.canary import AWAITING

console = Console(stderr=True)
out = Console()


def drive(lake: Lake, job_id: str, as_json: bool) -> None:
    """Run the job in this process with a progress bar; print the report; exit non-zero on failure."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[rate]}"),
                   TimeRemainingColumn(), console=console, disable=as_json or not console.is_terminal)
    task = bar.add_task("writing", total=None, rate="")

    def on_progress(info: dict[str, Any]) -> None:
        rate = f"{info['rows_per_second']:,} rows/s" if info["rows_per_second"] else ""
        bar.update(task, total=info["rows_total"] or None, completed=info["rows_processed"],
                   description=f"writing {info['units_done']}/{info['units_total']} units", rate=rate)

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
        with bar:
            run_job(lake.runtime, job_id, on_progress=on_progress, cancel=cancel)
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
    report = build_report(lake.runtime.store.get_job(job_id), lake.runtime.store.units(job_id))
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


def status_line(info: dict[str, Any]) -> str:
    rate = f", {info['rows_per_second']:,} rows/s" if info["rows_per_second"] else ""
    eta = f", ETA {info['eta_seconds']:.0f} s" if info["eta_seconds"] else ""
    err = f" — {one_line(info['error'])}" if info.get("error") else ""
    if "execution" in info:
        err += f" [execution {info['execution']['status']}]"
    return (f"{info['job_id']} {info['phase']}: {info['units_done']}/{info['units_total']} units, "
            f"{info['rows_processed']:,}/{info['rows_total']:,} rows{rate}{eta}{err}")


def print_report(r: dict[str, Any]) -> None:
    grid = RichTable(title=safe(f"{r['job_id']} — {r['table']} — {r['phase']}"), show_header=False)
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("mode", r["mode"]), ("source", r["source"]),
        ("time range", f"{(r['time_range'] or {}).get('min')} … {(r['time_range'] or {}).get('max')}"),
        ("rows in source", r["rows_in_source"]), ("rows written", r["rows_written"]),
        ("duplicates in source", r["rows_duplicate_in_source"]), ("conflicting existing", r["rows_conflicting_existing"]),
        ("overlap with existing", r["overlap_existing_rows"]), ("outside retention", r["rows_outside_retention"]),
        ("outside range", r["rows_outside_range"]), ("rejected", json.dumps(r["rows_rejected"]["reasons"])),
        ("units / files", f"{r['units']} / {r['files']}"),
        ("source gaps", ", ".join(f"{g['start']}…{g['end']}" for g in r["source_gaps"][:5]) or "none"),
        ("estimated cost", _cost(r["estimated_cost"])),
        ("source limits", _source_limits(r["source_limits"])),
        ("published snapshots", ", ".join(map(str, r["published_snapshot_ids"])) or "none"),
    ]
    for key, value in rows:
        grid.add_row(key, safe(value))
    for check in r["checks"]:
        mark = "[green]pass[/]" if check["passed"] else ("[red]FAIL[/]" if check["blocking"] else "[yellow]warn[/]")
        grid.add_row(f"check {check['name']}", f"{mark} {safe(check['detail'])}")
    out.print(grid)


def print_canary(c: dict[str, Any], job_id: str, deadline: str | None) -> None:
    """The canary day as a person judges it: counts, rows through the mapping, columns, projections."""
    out.print(f"[bold]canary {c['day']}[/] ({c['range']['start']} … {c['range']['end']}): {c['rows_in_source']:,} rows in, "
              f"{c['rows_written']:,} staged, {c['rows_duplicate_in_source']:,} duplicates, "
              f"{c['rows_conflicting_existing']:,} conflicting existing; {c['units']} unit(s), {c['files']} file(s)")
    samples = RichTable("where", "source row", "mapped row (UTC)", "existing row on main", "outcome", title="sample rows")
    for s in c["samples"]:
        samples.add_row(s["origin"], _row_text(s["source"]), _row_text(s["mapped"]), _row_text(s["existing"]), s["outcome"])
    out.print(samples)
    columns = RichTable("column", "source min", "source max", "source nulls", "staged min", "staged max", "staged nulls",
                        title="columns, source rows of the day vs staged")
    for col in c["columns"]:
        src, staged = col["source"], col["staged"]
        columns.add_row(col["column"], *(str(x) for x in (src["min"], src["max"], src["nulls"], staged["min"], staged["max"], staged["nulls"])))
    out.print(columns)
    p = c["projected"]
    speed = f"; {p['canary_rows_per_second']:,} rows/s in the canary" if p["canary_rows_per_second"] else ""
    out.print(f"whole job: {p['rows_in_scope']:,} rows in scope, ~{p['rows_written']:,} to write, {p['units']} unit(s) / "
              f"{p['files']} file(s), {_cost(p['estimated_cost'])}{speed}")
    out.print(f"approve with: timelake backfill continue {job_id}    drop it with: timelake backfill abort {job_id}")
    if deadline:
        out.print(f"approve before {deadline}: after that the job is aborted")


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


def fail(message: str) -> None:
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
    width = sum(column.min_width + 3 for column in grid.columns) + 1
    out.print(grid, crop=False, width=max(width, out.width))
