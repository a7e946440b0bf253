"""The `timelake` command line: backfill (run, status, resume, list, schema) and demo.

Every failure exits non-zero with one line naming what is wrong; `--json` prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table as RichTable
from typer.core import TyperGroup

from .errors import BackfillError
from .lake import Lake, connect
from .report import build_report, progress
from .runner import TERMINAL, run_job
from .spec import JobSpec

console = Console(stderr=True)
out = Console()

Warehouse = Annotated[
    Optional[Path], typer.Option("--warehouse", envvar="TIMELAKE_WAREHOUSE", help="Lake folder (default ./.timelake)")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object")]
On = Annotated[str, typer.Option("--on", help="local (embedded lake) or aws (the deployed workflow)")]


class _BackfillGroup(TyperGroup):
    """`timelake backfill TABLE …` runs a job; `timelake backfill status|resume|list …` are subcommands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(add_completion=False, no_args_is_help=True, help="timelake: load history into live Iceberg tables.")
backfill_app = typer.Typer(
    cls=_BackfillGroup, no_args_is_help=True,
    help="Backfill a table: `timelake backfill TABLE --from SRC \\[options]`, or status/resume/list a job.",
)
app.add_typer(backfill_app, name="backfill")


def _lake(warehouse: Path | None) -> Lake:
    return connect(warehouse=warehouse)


def _parse_map(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    pairs = {}
    for item in text.split(","):
        table_col, sep, source_col = item.partition("=")
        if not sep or not table_col.strip() or not source_col.strip():
            raise typer.BadParameter(f"'{item}' is not table_column=source_column", param_hint="--map")
        pairs[table_col.strip()] = source_col.strip()
    return pairs


@backfill_app.command("run", hidden=True)
def run(
    table: Annotated[str, typer.Argument(help="Target table, namespace.name")],
    source: Annotated[Optional[str], typer.Option("--from", help="Source path, glob or URI")] = None,
    job_file: Annotated[Optional[Path], typer.Option("--job", help="A job JSON file (the job schema)")] = None,
    map_: Annotated[Optional[str], typer.Option("--map", help="table_col=source_col,…")] = None,
    tz: Annotated[Optional[str], typer.Option("--tz", help="IANA zone of naive source times")] = None,
    mode: Annotated[str, typer.Option("--mode", help="merge | replace | append")] = "merge",
    start: Annotated[Optional[str], typer.Option("--start", help="Inclusive lower bound (ISO)")] = None,
    end: Annotated[Optional[str], typer.Option("--end", help="Exclusive upper bound (ISO)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only; change nothing")] = False,
    publish_by: Annotated[Optional[str], typer.Option("--publish-by", help="day | week | month")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency")] = None,
    assertions: Annotated[Optional[list[str]], typer.Option("--assert", help="SQL over `staged` returning failing rows")] = None,
    override_retention: Annotated[bool, typer.Option("--override-retention")] = False,
    time_unit: Annotated[Optional[str], typer.Option("--time-unit", help="s | ms | us | ns for epoch integers")] = None,
    dst_policy: Annotated[str, typer.Option("--dst-policy", help="refuse | earliest | latest | drop")] = "refuse",
    fmt: Annotated[Optional[str], typer.Option("--format", help="parquet | csv | json | influx (default: from extension)")] = None,
    from_sql: Annotated[Optional[str], typer.Option("--from-sql", help="A DuckDB query as the source")] = None,
    measurement: Annotated[Optional[str], typer.Option("--measurement", help="InfluxDB measurement (default: table name)")] = None,
    precision: Annotated[Optional[str], typer.Option("--precision", help="ns | us | ms | s of line-protocol times")] = None,
    as_json: JsonFlag = False,
    warehouse: Warehouse = None,
    on: On = "local",
) -> None:
    """Run a backfill job."""
    fields: dict[str, Any] = json.loads(job_file.read_text()) if job_file else {}
    given = {
        "source": source, "map": _parse_map(map_) or None, "tz": tz, "start": start, "end": end,
        "publish_by": publish_by, "max_concurrency": max_concurrency, "assertions": assertions or None,
        "time_unit": time_unit, "format": fmt, "measurement": measurement, "precision": precision,
        "query": from_sql,
    }
    fields.update({k: v for k, v in given.items() if v is not None})
    fields["table"] = table
    if from_sql and not source:
        fields["source"] = "duckdb:"
    for flag, value, default in (("mode", mode, "merge"), ("dst_policy", dst_policy, "refuse")):
        if value != default or flag not in fields:
            fields[flag] = value
    fields["dry_run"] = dry_run or fields.get("dry_run", False)
    fields["override_retention"] = override_retention or fields.get("override_retention", False)
    if not fields.get("source"):
        _fail("--from SRC (or a --job file with a source) is required")
    spec = JobSpec.model_validate(fields)
    if _on_aws(on):
        _print_json_or(_aws().submit(spec), as_json, "started")
        return
    lake = _lake(warehouse)
    lake.create_job(spec)
    if not as_json:
        console.print(f"job [bold]{spec.job_id}[/] on {spec.table} ({'dry run, ' if spec.dry_run else ''}mode {spec.mode})")
    _drive(lake, spec.job_id, as_json)


@backfill_app.command("resume")
def resume(job_id: str, as_json: JsonFlag = False, warehouse: Warehouse = None, on: On = "local") -> None:
    """Continue a job from its first unfinished step (done units are skipped)."""
    if _on_aws(on):
        _print_json_or(_aws().resume(job_id), as_json, "resumed")
        return
    lake = _lake(warehouse)
    lake.job(job_id).record()
    if lake.runtime.store.get_job(job_id).phase == "failed_validation":
        _fail(f"job {job_id} failed validation; nothing was published. Fix the source and start a new job")
    _drive(lake, job_id, as_json)


@backfill_app.command("status")
def status(
    job_id: str, watch: Annotated[bool, typer.Option("--watch", help="Refresh until the job ends")] = False,
    as_json: JsonFlag = False, warehouse: Warehouse = None, on: On = "local",
) -> None:
    """Phase, units done/total, rows, throughput and ETA."""
    if _on_aws(on):
        orchestrator = _aws()
        current = lambda: orchestrator.status(job_id)  # noqa: E731
    else:
        store = _lake(warehouse).runtime.store
        current = lambda: progress(store.get_job(job_id), store.units(job_id))  # noqa: E731
    while True:
        info = current()
        if as_json:
            out.print_json(json.dumps(info))
        else:
            out.print(_status_line(info))
        if not watch or info["phase"] in TERMINAL or info["phase"] == "failed":
            break
        time.sleep(1.0)


@backfill_app.command("list")
def list_jobs(
    table: Annotated[Optional[str], typer.Argument()] = None, as_json: JsonFlag = False, warehouse: Warehouse = None
) -> None:
    """Jobs, oldest first."""
    lake = _lake(warehouse)
    store = lake.runtime.store
    rows = [progress(j, store.units(j.job_id)) | {"mode": j.spec.get("mode"), "dry_run": j.spec.get("dry_run")}
            for j in store.list_jobs(table)]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    grid = RichTable("job", "table", "mode", "phase", "units", "rows")
    for r in rows:
        grid.add_row(r["job_id"], r["table"], ("dry run " if r["dry_run"] else "") + str(r["mode"]), r["phase"],
                     f"{r['units_done']}/{r['units_total']}", f"{r['rows_processed']:,}")
    out.print(grid)


@backfill_app.command("abort")
def abort_job(job_id: str, as_json: JsonFlag = False, warehouse: Warehouse = None, on: On = "local") -> None:
    """Stop a job; remove its branch, its unpublished files and its lease. Main is untouched."""
    if _on_aws(on):
        result = _aws().abort(job_id)
    else:
        job = _lake(warehouse).job(job_id)
        result = job.abort()
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(f"aborted job {job_id}: {result['files_deleted']} unpublished file(s) deleted, branch and lease removed")


@backfill_app.command("leases")
def leases(table: str, as_json: JsonFlag = False, warehouse: Warehouse = None) -> None:
    """Ranges of TABLE held by unpublished backfills (a compactor skips them)."""
    from .timeutil import iso

    held = [{"job_id": lease.job_id, "table": lease.table, "start": iso(lease.start), "end": iso(lease.end)}
            for lease in _lake(warehouse).leases(table)]
    if as_json:
        out.print_json(json.dumps(held))
        return
    grid = RichTable("job", "table", "start", "end")
    for lease in held:
        grid.add_row(lease["job_id"], lease["table"], lease["start"], lease["end"])
    out.print(grid if held else f"no leases on {table}")


@backfill_app.command("history")
def history(table: str, as_json: JsonFlag = False, warehouse: Warehouse = None) -> None:
    """Published backfills of TABLE: when, range, mode, source, rows, snapshots (from timelake.backfills)."""
    from .provenance import history as read_history

    rows = read_history(_lake(warehouse).runtime, table).to_pylist()
    if as_json:
        out.print_json(json.dumps(rows, default=str))
        return
    grid = RichTable("published", "job", "mode", "range", "source", "written", "dropped", "snapshots")
    for r in rows:
        dropped = r["rows_duplicate_in_source"] + r["rows_conflicting_existing"] + r["rows_rejected"]
        grid.add_row(f"{r['published_at']:%Y-%m-%d %H:%M}", r["job_id"], r["mode"],
                     f"{r['range_start']:%Y-%m-%d} … {r['range_end']:%Y-%m-%d}", r["source_uri"],
                     f"{r['rows_written']:,}", f"{dropped:,}", ", ".join(map(str, r["snapshot_ids"])))
    out.print(grid if rows else f"no published backfills on {table}")


@backfill_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of the job JSON."""
    out.print_json(json.dumps(JobSpec.model_json_schema()))


@app.command("demo")
def demo(
    warehouse: Annotated[Path, typer.Option("--warehouse", help="Demo lake folder (recreated)")] = Path(".timelake-demo"),
) -> None:
    """Build a live table with a gap, backfill a historian export into it while a live writer runs."""
    from .demo import run_demo

    run_demo(warehouse)


def _on_aws(on: str) -> bool:
    if on not in ("local", "aws"):
        raise typer.BadParameter(f"'{on}' is not local or aws", param_hint="--on")
    return on == "aws"


def _aws() -> Any:
    from .aws.orchestrator import from_environment

    return from_environment()


def _print_json_or(result: dict[str, Any], as_json: bool, verb: str) -> None:
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(f"{verb} job {result['job_id']}: execution {result['execution_arn']}"
                  + (f" ({result['how']})" if "how" in result else ""))


def _drive(lake: Lake, job_id: str, as_json: bool) -> None:
    """Run the job in this process with a progress bar; print the report; exit non-zero on failure."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[rate]}"),
                   TimeRemainingColumn(), console=console, disable=as_json or not console.is_terminal)
    task = bar.add_task("writing", total=None, rate="")

    def on_progress(info: dict[str, Any]) -> None:
        rate = f"{info['rows_per_second']:,} rows/s" if info["rows_per_second"] else ""
        bar.update(task, total=info["rows_total"] or None, completed=info["rows_processed"],
                   description=f"writing {info['units_done']}/{info['units_total']} units", rate=rate)

    error: str | None = None
    try:
        with bar:
            run_job(lake.runtime, job_id, on_progress=on_progress)
    except KeyboardInterrupt:
        print(f"interrupted: job {job_id} can be resumed with: timelake backfill resume {job_id}", file=sys.stderr)
        raise typer.Exit(130) from None
    except BackfillError as exc:
        error = str(exc)
    report = build_report(lake.runtime.store.get_job(job_id), lake.runtime.store.units(job_id))
    if as_json:
        out.print_json(json.dumps(report, default=str))
    else:
        _print_report(report)
    if error:
        _fail(error)


def _status_line(info: dict[str, Any]) -> str:
    rate = f", {info['rows_per_second']:,} rows/s" if info["rows_per_second"] else ""
    eta = f", ETA {info['eta_seconds']:.0f} s" if info["eta_seconds"] else ""
    err = f" — {info['error']}" if info.get("error") else ""
    if "execution" in info:
        err += f" [execution {info['execution']['status']}]"
    return (f"{info['job_id']} {info['phase']}: {info['units_done']}/{info['units_total']} units, "
            f"{info['rows_processed']:,}/{info['rows_total']:,} rows{rate}{eta}{err}")


def _print_report(r: dict[str, Any]) -> None:
    grid = RichTable(title=f"{r['job_id']} — {r['table']} — {r['phase']}", show_header=False)
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
        ("published snapshots", ", ".join(map(str, r["published_snapshot_ids"])) or "none"),
    ]
    for key, value in rows:
        grid.add_row(key, str(value))
    for check in r["checks"]:
        mark = "[green]pass[/]" if check["passed"] else ("[red]FAIL[/]" if check["blocking"] else "[yellow]warn[/]")
        grid.add_row(f"check {check['name']}", f"{mark} {check['detail']}")
    out.print(grid)


def _cost(cost: dict[str, Any] | None) -> str:
    if not cost:
        return "n/a"
    return f"~{cost['local_wall_seconds']} s here on {cost['local_cores']} core(s); ~${cost['aws_usd']:.4f} on AWS"


def _fail(message: str) -> None:
    print(f"error: {_one_line(message)}", file=sys.stderr)
    raise typer.Exit(1)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main() -> None:
    """Entry point: user errors print one line and exit 1 instead of a traceback."""
    from pydantic import ValidationError

    try:
        app()
    except (BackfillError, ValueError, FileNotFoundError) as exc:
        if isinstance(exc, ValidationError):
            message = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors())
        else:
            message = str(exc) or type(exc).__name__
        print(f"error: {_one_line(message)}", file=sys.stderr)
        sys.exit(1)
