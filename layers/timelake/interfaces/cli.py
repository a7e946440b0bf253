"""The `timelake` command line: backfill (run, status, resume, list, schema) and demo.

Every failure exits non-zero with one line naming what is wrong; `--json` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import os
import re
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Annotated, Any

import pyarrow as pa
import typer
from rich.markup import escape
from typer.core import TyperGroup

from timelake.errors import BackfillError
from timelake.interfaces.console import (
    ChunkDisplay, console, drive, fail, one_line, out, print_table, safe, status_line,
)
from timelake.interfaces.lake import Lake, connect, job_catalog
from timelake.model.report import INTERRUPTED, progress_of, report_of
from timelake.model.spec import JobSpec, external_job, parse_document
from timelake.model.timeutil import iso_seconds
from timelake.ports.store import Phase
from timelake.runner import TERMINAL, WAITING
from timelake.steps.canary import approve as approve_canary

FIRST_DAY = "first"

Warehouse = Annotated[
    Path | None, typer.Option("--warehouse", envvar="TIMELAKE_WAREHOUSE", help="Lake folder (default ./.timelake)")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object")]
On = Annotated[str, typer.Option("--on", help="local (embedded lake) or aws (the deployed workflow)")]


class _BackfillGroup(TyperGroup):
    """`timelake backfill TABLE …` runs a job; `timelake backfill status|resume|list …` are subcommands."""

    default = "run"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = [self.default, *args]
        return super().parse_args(ctx, _canary_value(args))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The group's help, then the main form's: ``TABLE --from SRC`` with every option described."""
        super().format_help(ctx, formatter)
        main = self.commands[self.default]
        main.format_help(type(ctx)(main, info_name=ctx.info_name, parent=ctx.parent), formatter)


def _canary_value(args: list[str]) -> list[str]:
    """``--canary`` takes an optional DAY: a bare ``--canary`` means the first day with source rows."""
    result = []
    for i, arg in enumerate(args):
        if arg == "--canary" and not (i + 1 < len(args) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", args[i + 1])):
            arg = f"--canary={FIRST_DAY}"
        result.append(arg)
    return result


class _CoverageGroup(_BackfillGroup):
    """`timelake coverage TABLE …` shows the map; `timelake coverage refresh TABLE` rebuilds the signal."""

    default = "show"


app = typer.Typer(add_completion=False, no_args_is_help=True, help="timelake: load history into live Iceberg tables.")
backfill_app = typer.Typer(
    cls=_BackfillGroup, no_args_is_help=True,
    help="Backfill a table: `timelake backfill TABLE --from SRC \\[options]`, or status/resume/list a job.",
)
app.add_typer(backfill_app, name="backfill")
coverage_app = typer.Typer(
    cls=_CoverageGroup, no_args_is_help=True,
    help="Coverage of a table: `timelake coverage TABLE \\[options]`, or `timelake coverage refresh TABLE`.",
)
app.add_typer(coverage_app, name="coverage")
table_app = typer.Typer(no_args_is_help=True, help="A table's contract: show it, declare rollups and rules, list rule events.")
app.add_typer(table_app, name="table")


def _lake(warehouse: Path | None, catalog: str | None) -> Lake:
    return connect(warehouse=warehouse, catalog=catalog)


def _job_lake(warehouse: Path | None, catalog: str | None, job_id: str) -> Lake:
    """The lake of a recorded job: the catalog it was started on unless ``--catalog`` names one, which
    must then be the same (the job's table, branch and files are there)."""
    lake = _lake(warehouse, catalog or job_catalog(job_id, warehouse))
    lake.job(job_id)
    return lake


def _one_query(query: str | None, from_sql: str | None) -> str | None:
    if query and from_sql:
        raise typer.BadParameter("give --query (a PostgreSQL source's SELECT) or --from-sql (a DuckDB query), not both")
    return query or from_sql


def _job_file(path: Path, table: str) -> dict[str, Any]:
    """The fields of a --job file; the positional TABLE must name the same table as the file, if it names one."""
    try:
        fields = parse_document(path.read_bytes())
    except OSError as exc:
        raise BackfillError(f"--job {path}: {exc.strerror or exc}") from None
    if not isinstance(fields, dict):
        raise BackfillError(f"--job {path}: a job is a JSON object, not {type(fields).__name__}")
    if "table" in fields and fields["table"] != table:
        raise BackfillError(f"--job {path} is for table '{fields['table']}' but the command names '{table}'")
    return fields


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


#: run-command parameters named differently from the job field they set (the others share its name)
PARAM_FIELDS = {"map_": "map", "fmt": "format", "approval_timeout": "approval_timeout_seconds", "no_diff": "diff"}


def field_help(name: str) -> str:
    """An option's help is the job model's description of its field, so the CLI, the JSON schema and the
    docs' table cannot drift; escaped, because Rich would take ``[for PT10M]`` for a style tag."""
    return escape(JobSpec.model_fields[name].description or "")


CatalogName = Annotated[str | None, typer.Option(
    "--catalog", envvar="TIMELAKE_CATALOG", metavar="NAME",
    help=field_help("catalog"))]


def field_of(param: str) -> str | None:
    """The job field a run-command parameter sets, or None for the command's own options (--job, --json, …)."""
    name = PARAM_FIELDS.get(param, param)
    return name if name in JobSpec.model_fields else None


@backfill_app.command("run", hidden=True)
def run(
    table: Annotated[str, typer.Argument(help=field_help("table"))],
    source: Annotated[str | None, typer.Option("--from", help=field_help("source"))] = None,
    job_file: Annotated[Path | None, typer.Option("--job", help="A job JSON file (the job schema); flags given "
                                                     "on the command line override its fields")] = None,
    map_: Annotated[str | None, typer.Option("--map", metavar="COL=SRC,…", help=field_help("map"))] = None,
    tz: Annotated[str | None, typer.Option("--tz", help=field_help("tz"))] = None,
    mode: Annotated[str, typer.Option("--mode", help=field_help("mode"))] = "merge",
    start: Annotated[str | None, typer.Option("--start", help=field_help("start"))] = None,
    end: Annotated[str | None, typer.Option("--end", help=field_help("end"))] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=field_help("dry_run"))] = False,
    publish_by: Annotated[str | None, typer.Option("--publish-by", help=field_help("publish_by"))] = None,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", help=field_help("max_concurrency"))] = None,
    run_between: Annotated[str | None, typer.Option("--run-between", metavar="HH:MM-HH:MM", help=field_help("run_between"))] = None,
    run_tz: Annotated[str | None, typer.Option("--run-tz", metavar="ZONE", help=field_help("run_tz"))] = None,
    assertions: Annotated[list[str] | None, typer.Option("--assert", help=field_help("assertions"))] = None,
    assertion_timeout: Annotated[int | None, typer.Option(
        "--assertion-timeout", metavar="SECONDS", help=field_help("assertion_timeout"))] = None,
    override_retention: Annotated[bool, typer.Option("--override-retention", help=field_help("override_retention"))] = False,
    evaluate_rules: Annotated[bool, typer.Option("--evaluate-rules", help=field_help("evaluate_rules"))] = False,
    time_unit: Annotated[str | None, typer.Option("--time-unit", help=field_help("time_unit"))] = None,
    dst_policy: Annotated[str, typer.Option("--dst-policy", help=field_help("dst_policy"))] = "infer",
    fmt: Annotated[str | None, typer.Option("--format", help=field_help("format"))] = None,
    canary: Annotated[str | None, typer.Option("--canary", metavar="[DAY]", help=field_help("canary"))] = None,
    approval_timeout: Annotated[int | None, typer.Option(
        "--approval-timeout", metavar="SECONDS", help=field_help("approval_timeout_seconds"))] = None,
    query: Annotated[str | None, typer.Option("--query", help=field_help("query"))] = None,
    source_max_connections: Annotated[int | None, typer.Option(
        "--source-max-connections", help=field_help("source_max_connections"))] = None,
    source_rows_per_second: Annotated[int | None, typer.Option(
        "--source-rows-per-second", help=field_help("source_rows_per_second"))] = None,
    from_sql: Annotated[str | None, typer.Option("--from-sql", help="A DuckDB query as the source (sets source "
                                                    "'duckdb:' and the query field)")] = None,
    measurement: Annotated[str | None, typer.Option("--measurement", help=field_help("measurement"))] = None,
    reason: Annotated[str | None, typer.Option("--reason", metavar="TEXT", help=field_help("reason"))] = None,
    no_diff: Annotated[bool, typer.Option("--no-diff", help=field_help("diff"))] = False,
    precision: Annotated[str | None, typer.Option("--precision", help=field_help("precision"))] = None,
    null_values: Annotated[list[str] | None, typer.Option("--null-values", help=field_help("null_values"))] = None,
    on_bad_value: Annotated[str | None, typer.Option("--on-bad-value", help=field_help("on_bad_value"))] = None,
    max_rejected: Annotated[str | None, typer.Option(
        "--max-rejected", metavar="ROWS|PCT%", help=field_help("max_rejected"))] = None,
    states_column: Annotated[str | None, typer.Option("--states-column", help=field_help("states_column"))] = None,
    delimiter: Annotated[str | None, typer.Option("--delimiter", help=field_help("delimiter"))] = None,
    decimal: Annotated[str | None, typer.Option("--decimal", help=field_help("decimal"))] = None,
    thousands: Annotated[str | None, typer.Option("--thousands", help=field_help("thousands"))] = None,
    wide: Annotated[bool, typer.Option("--wide", "--unpivot", help=field_help("wide"))] = False,
    id_columns: Annotated[str | None, typer.Option("--id-columns", metavar="COL,…", help=field_help("id_columns"))] = None,
    key_separator: Annotated[str | None, typer.Option("--key-separator", help=field_help("key_separator"))] = None,
    timestamp_format: Annotated[str | None, typer.Option(
        "--timestamp-format", help=field_help("timestamp_format"))] = None,
    skip_rows: Annotated[int | None, typer.Option("--skip-rows", help=field_help("skip_rows"))] = None,
    skip_after_header: Annotated[int | None, typer.Option(
        "--skip-after-header", help=field_help("skip_after_header"))] = None,
    encoding: Annotated[str | None, typer.Option("--encoding", help=field_help("encoding"))] = None,
    as_json: JsonFlag = False,
    warehouse: Warehouse = None,
    catalog: CatalogName = None,
    on: On = "local",
) -> None:
    """Run a backfill job."""
    fields = _job_file(job_file, table) if job_file else {}
    given = {
        "source": source, "map": _parse_map(map_) or None, "tz": tz, "start": start, "end": end,
        "publish_by": publish_by, "max_concurrency": max_concurrency, "assertions": assertions or None, "assertion_timeout": assertion_timeout,
        "time_unit": time_unit, "format": fmt, "canary": True if canary == FIRST_DAY else canary,
        "approval_timeout_seconds": approval_timeout,
        "query": _one_query(query, from_sql), "source_max_connections": source_max_connections,
        "source_rows_per_second": source_rows_per_second, "measurement": measurement, "precision": precision,
        "null_values": null_values, "on_bad_value": on_bad_value, "delimiter": delimiter, "decimal": decimal,
        "timestamp_format": timestamp_format, "skip_rows": skip_rows, "encoding": encoding,
        "max_rejected": max_rejected, "states_column": states_column, "thousands": thousands,
        "id_columns": [c.strip() for c in id_columns.split(",") if c.strip()] if id_columns else None,
        "key_separator": key_separator, "skip_after_header": skip_after_header,
        "run_between": run_between, "run_tz": run_tz, "reason": reason, "diff": False if no_diff else None,
    }
    fields.update({k: v for k, v in given.items() if v is not None})
    fields["table"] = table
    if from_sql and not source:
        fields["source"] = "duckdb:"
    for flag, value, default in (("mode", mode, "merge"), ("dst_policy", dst_policy, "infer")):
        if value != default or flag not in fields:
            fields[flag] = value
    fields["dry_run"] = dry_run or fields.get("dry_run", False)
    fields["override_retention"] = override_retention or fields.get("override_retention", False)
    fields["evaluate_rules"] = evaluate_rules or fields.get("evaluate_rules", False)
    fields["wide"] = wide or fields.get("wide", False)
    if catalog:
        fields["catalog"] = catalog
    if not fields.get("source"):
        fail("--from SRC (or a --job file with a source) is required")
    spec = external_job(fields)
    if _on_aws(on):
        _print_json_or(_aws().submit(spec), as_json, "started")
        return
    lake = _lake(warehouse, spec.catalog)
    lake.create_job(spec)
    if not as_json:
        console.print(f"job [bold]{spec.job_id}[/] on {safe(spec.table)} ({'dry run, ' if spec.dry_run else ''}mode {spec.mode})")
    drive(lake, spec.job_id, as_json)


@backfill_app.command("resume")
def resume(job_id: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None, on: On = "local") -> None:
    """Continue a job from its first unfinished step (done units are skipped)."""
    if _on_aws(on):
        _print_json_or(_aws().resume(job_id), as_json, "resumed")
        return
    lake = _job_lake(warehouse, catalog, job_id)
    phase = lake.job(job_id).record().phase
    if lake.runtime.store.running(job_id):
        fail(f"job {job_id} is running in another process; follow it with: timelake backfill status {job_id} --watch")
    if phase == Phase.FAILED_VALIDATION:
        fail(f"job {job_id} failed validation; nothing was published. Fix the source and start a new job")
    if phase == Phase.ABORTED:
        fail(f"job {job_id} was aborted; start a new job")
    drive(lake, job_id, as_json)


@backfill_app.command("set")
def set_settings(
    job_id: str,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", help=field_help("max_concurrency"))] = None,
    source_rows_per_second: Annotated[int | None, typer.Option(
        "--source-rows-per-second", help=field_help("source_rows_per_second"))] = None,
    as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None, on: On = "local",
) -> None:
    """Change a job's settings while it runs: writers and scan tasks at once (from the next unit), source
    rows per second (from the next rows read). A finished job is refused; an interrupted one resumes with them."""
    if max_concurrency is None and source_rows_per_second is None:
        fail("nothing to set: give --max-concurrency and/or --source-rows-per-second")
    wanted = {"max_concurrency": max_concurrency, "source_rows_per_second": source_rows_per_second}
    result = _aws().set_settings(job_id, **wanted) if _on_aws(on) else _job_lake(warehouse, catalog, job_id).job(job_id).set(**wanted)
    if as_json:
        out.print_json(json.dumps(result))
        return
    rate = result["settings"]["source_rows_per_second"]
    out.print(f"job {job_id}: max concurrency {result['settings']['max_concurrency'] or 'default (CPU count)'}, "
              f"source rows/s {'default' if rate is None else 'no limit' if rate == 0 else f'{rate:,}'}"
              + (f"; running map(s) updated: {', '.join(result['map_runs_updated'])}" if result.get("map_runs_updated") else ""))


@backfill_app.command("continue")
def continue_job(job_id: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None, on: On = "local") -> None:
    """Approve a canary: write the rest of the job, validate all of it and publish."""
    if _on_aws(on):
        _print_json_or(_aws().approve(job_id), as_json, "approved")
        return
    lake = _job_lake(warehouse, catalog, job_id)
    approve_canary(lake.runtime, job_id, in_time=True)
    drive(lake, job_id, as_json)


@backfill_app.command("status")
def status(
    job_id: str, watch: Annotated[bool, typer.Option("--watch", help="Refresh until the job ends")] = False,
    as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None, on: On = "local",
) -> None:
    """Phase, units done/total, rows, throughput and ETA."""
    if _on_aws(on):
        orchestrator = _aws()
        current = lambda: orchestrator.status(job_id)  # noqa: E731
    else:
        store = _lake(warehouse, catalog).runtime.store
        current = lambda: progress_of(store, job_id)  # noqa: E731
    while True:
        info = current()
        if as_json:
            out.print_json(json.dumps(info))
        else:
            out.print(status_line(info), markup=False, soft_wrap=True)
        if not watch or info["phase"] in TERMINAL | WAITING | {Phase.FAILED, INTERRUPTED}:
            break
        time.sleep(1.0)


@backfill_app.command("list")
def list_jobs(
    table: Annotated[str | None, typer.Argument()] = None,
    dry_runs: Annotated[bool, typer.Option("--dry-runs", help="Also list dry runs (which change nothing)")] = False,
    as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None,
) -> None:
    """Jobs, oldest first: phase, units, rows read from the source and rows written to the table."""
    lake = _lake(warehouse, catalog)
    store = lake.runtime.store
    rows = []
    for j in store.list_jobs(table):
        if j.spec.get("dry_run") and not dry_runs:
            continue
        report = report_of(store, j.job_id)
        rows.append(report["progress"] | {
            "catalog": j.spec.get("catalog"), "mode": j.spec.get("mode"), "dry_run": j.spec.get("dry_run"),
            "started": iso_seconds(j.created_at), "ended": iso_seconds(j.updated_at) if j.phase in TERMINAL else None,
            "rows_in_source": report["rows_in_source"], "rows_written": report["rows_written"]})
    if as_json:
        out.print_json(json.dumps(rows))
        return
    print_table(["job", "table", "mode", "phase", "started", "ended", "units", "read", "written"], [
        [r["job_id"], r["table"], ("dry run " if r["dry_run"] else "") + str(r["mode"]), r["phase"], r["started"],
         r["ended"] or "", f"{r['units_done']}/{r['units_total']}", f"{r['rows_in_source'] or 0:,}",
         "—" if r["dry_run"] else f"{r['rows_written']:,}"] for r in rows],
        f"no jobs{' on ' + table if table else ''}{'' if dry_runs else ' (dry runs: --dry-runs)'}")


@backfill_app.command("abort")
def abort_job(job_id: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None, on: On = "local") -> None:
    """Stop a job; remove its branch, its unpublished files and its lease. Main is untouched."""
    if _on_aws(on):
        result = _aws().abort(job_id)
    else:
        job = _job_lake(warehouse, catalog, job_id).job(job_id)
        result = job.abort()
    if as_json:
        out.print_json(json.dumps(result))
    elif "how" in result:  # a canary waiting on AWS: the workflow runs the abort
        out.print(f"job {job_id}: {result['how']}")
    else:
        out.print(f"aborted job {job_id}: {result['files_deleted']} unpublished file(s) deleted, branch and lease removed")


@backfill_app.command("leases")
def leases(table: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None) -> None:
    """Ranges of TABLE held by unpublished backfills (a compactor skips them)."""
    from timelake.model.timeutil import iso

    lake = _lake(warehouse, catalog)
    lake.table(table)
    held = [{"job_id": lease.job_id, "table": lease.table, "start": iso(lease.start), "end": iso(lease.end)}
            for lease in lake.leases(table)]
    if as_json:
        out.print_json(json.dumps(held))
        return
    print_table(["job", "table", "start", "end"], [[h["job_id"], h["table"], h["start"], h["end"]] for h in held],
                f"no leases on {table}")


@backfill_app.command("history")
def history(table: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None) -> None:
    """Published backfills of TABLE: when, range, mode, source, rows, snapshots (from timelake.backfills)."""
    from timelake.followup.provenance import history as read_history

    lake = _lake(warehouse, catalog)
    lake.table(table)
    rows = read_history(lake.runtime, table).to_pylist()
    if as_json:
        out.print_json(json.dumps(rows, default=str))
        return
    print_table(["published", "job", "mode", "range", "source", "written", "dropped", "snapshots"], [
        [f"{r['published_at']:%Y-%m-%d %H:%M}", r["job_id"], r["mode"], f"{r['range_start']:%Y-%m-%d} … {r['range_end']:%Y-%m-%d}",
         r["source_uri"], f"{r['rows_written']:,}",
         f"{r['rows_duplicate_in_source'] + r['rows_conflicting_existing'] + r['rows_rejected']:,}",
         ", ".join(map(str, r["snapshot_ids"]))] for r in rows], f"no published backfills on {table}")


@backfill_app.command("diff")
def diff_job(
    job_id: str,
    html_file: Annotated[Path | None, typer.Option("--html", help="Also write a standalone HTML page")] = None,
    as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None, on: On = "local",
) -> None:
    """What JOB changes in its range (replace, merge): rows only before, only after, in both, values
    changed, and each column's sum and count before and after, per day and series, with sample rows side
    by side; a dry run's prediction, or a waiting canary's day."""
    from timelake.followup.diffview import diff_text, page

    lake = _deployed_lake() if _on_aws(on) else _job_lake(warehouse, catalog, job_id)
    found = lake.job(job_id).diff()
    cells = found.pop("cells")
    if html_file:
        html_file.write_text(page(found, cells))
    if as_json:
        out.print_json(json.dumps({**found, "cells": cells.to_pylist() if cells is not None else None}, default=str))
        return
    scope = "the canary day of " if found["scope"] == "canary" else ""
    out.print(safe(f"diff of {scope}job {job_id} on {found['table']} ({found['mode']}), {found['range']['start']} … "
                   f"{found['range']['end']}" + (": predicted by the dry run" if found["predicted"] else "")), soft_wrap=True)
    if found.get("reason"):
        out.print(safe(f"  reason: {found['reason']}"), soft_wrap=True)
    out.print(diff_text(found), end="", soft_wrap=True)
    if cells is None:
        out.print("  (the summary kept in timelake.backfills: the job's scratch files, with every cell, are gone)")
    if html_file:
        out.print(f"  page: {html_file}", soft_wrap=True)


@backfill_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of the job JSON."""
    out.print_json(json.dumps(JobSpec.model_json_schema()))


@coverage_app.command("show", hidden=True)
def coverage_show(
    table: Annotated[str, typer.Argument(help="Table, namespace.name")],
    start: Annotated[str | None, typer.Option("--start", help="Inclusive lower bound (ISO; default: oldest row)")] = None,
    end: Annotated[str | None, typer.Option("--end", help="Exclusive upper bound (ISO; default: newest row)")] = None,
    by: Annotated[str, typer.Option("--by", help="hour | day | month")] = "day",
    series: Annotated[bool, typer.Option("--series", help="Rows per series too (reads the series-key column only)")] = False,
    html_file: Annotated[Path | None, typer.Option("--html", help="Also write a standalone HTML page")] = None,
    as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None,
) -> None:
    """Rows, files, completeness and writer per bucket, from Iceberg metadata: a calendar heatmap."""
    from timelake.followup.heatmap import page, terminal

    cmap = _lake(warehouse, catalog).table(table).coverage_map(start, end, by=by, series=series)
    if html_file:
        html_file.write_text(page(cmap))
    if as_json:
        out.print_json(json.dumps(cmap.to_dict()))
        return
    out.print(terminal(cmap), end="", soft_wrap=True)
    if html_file:
        out.print(f"  page: {html_file}", soft_wrap=True)


@coverage_app.command("refresh")
def coverage_refresh(table: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None) -> None:
    """Rebuild TABLE's companion coverage table (`<table>__coverage`) from its metadata."""
    from timelake.followup.completion import companion_name, update

    written = update(_lake(warehouse, catalog).runtime, table)
    result = {"table": table, "coverage_table": companion_name(table), "partitions": written}
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(f"{result['coverage_table']}: {written} partition(s) written")


COLUMN_TYPES = {
    "timestamptz": pa.timestamp("us", tz="UTC"), "timestamp": pa.timestamp("us"), "date": pa.date32(), "string": pa.string(),
    "double": pa.float64(), "float": pa.float32(), "int": pa.int32(), "long": pa.int64(), "bigint": pa.int64(),
    "boolean": pa.bool_(),
}


def _columns(text: str) -> pa.Schema:
    """``'ts timestamptz, device_id string, value double'`` as an Arrow schema."""
    fields = []
    for item in text.split(","):
        name, _, kind = item.strip().partition(" ")
        if not name or kind.strip().lower() not in COLUMN_TYPES:
            raise typer.BadParameter(f"'{item.strip()}' is not 'NAME TYPE' with TYPE one of {', '.join(COLUMN_TYPES)}",
                                     param_hint="--schema")
        fields.append(pa.field(name, COLUMN_TYPES[kind.strip().lower()]))
    return pa.schema(fields)


def _sample_columns(path: str) -> pa.Schema:
    """The columns of a sample file, with the types Arrow infers from it; its times become UTC, as the
    table stores them."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        fail(f"--like {path}: no such file")
    name = path.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        schema = pq.read_schema(path)
    elif name.endswith((".json", ".jsonl", ".ndjson")):
        schema = pajson.read_json(path).schema
    else:
        schema = pacsv.open_csv(path).schema
    return pa.schema([f.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) else f for f in schema])


def _partition_by(text: str) -> str | dict[str | None, str]:
    """``day``, or tiers by age: ``P90D:day,P2Y:month,year``."""
    if ":" not in text and "," not in text:
        return text.strip()
    tiers: dict[str | None, str] = {}
    for item in text.split(","):
        age, sep, transform = item.strip().rpartition(":")
        tiers[age.strip() if sep else None] = transform.strip()
    return tiers


@table_app.command("create")
def create_table(
    table: Annotated[str, typer.Argument(help="namespace.name")],
    schema: Annotated[str | None, typer.Option("--schema", help="Columns as 'NAME TYPE, …', e.g. 'ts timestamptz, device_id string, value double'")] = None,
    like: Annotated[str | None, typer.Option("--like", metavar="FILE", help="Take the columns from a sample file (Parquet, CSV, JSON)")] = None,
    time: Annotated[str | None, typer.Option("--time", help="The time column (default: the only timestamp column)")] = None,
    series: Annotated[str | None, typer.Option("--series", help="The series key columns, comma-separated, e.g. device_id")] = None,
    partition_by: Annotated[str, typer.Option("--partition-by", help="day, hour, month, year, or tiers by age: 'P90D:day,P2Y:month,year'")] = "day",
    retention: Annotated[str | None, typer.Option("--retention", help="How far back rows are kept, e.g. P3Y")] = None,
    target_file_size: Annotated[str, typer.Option("--target-file-size", help="Size of the files the backfill writes")] = "128MB",
    expected_interval: Annotated[str | None, typer.Option("--expected-interval", help="One row per series every …, e.g. PT1M: what coverage measures against")] = None,
    expected_series: Annotated[int | None, typer.Option("--expected-series", help="How many series the table should hold (with --expected-interval, a day is complete or partial, not only 'has data')")] = None,
    as_json: JsonFlag = False,
    warehouse: Warehouse = None, catalog: CatalogName = None,
    on: Annotated[str, typer.Option("--on", help="local (embedded lake) or aws (the deployed stack's Glue catalog and bucket)")] = "local",
) -> None:
    """Create TABLE with its contract: columns from --schema or a sample file (--like), time column, series key."""
    if schema is not None and like is None:
        columns = _columns(schema)
    elif like is not None and schema is None:
        columns = _sample_columns(like)
    else:
        fail("give the columns with --schema 'NAME TYPE, …' or --like FILE (one of them)")
    if time is None:
        times = [f.name for f in columns if pa.types.is_timestamp(f.type)]
        if len(times) != 1:
            fail(f"name the time column with --time (timestamp columns: {', '.join(times) or 'none'})")
        time = times[0]
    keys = [k.strip() for k in (series or "").split(",") if k.strip()]
    lake = _deployed_lake() if _on_aws(on) else _lake(warehouse, catalog)
    if _on_aws(on):
        lake.runtime.check_catalog(catalog)
    handle = lake.create_table(table, columns, time_column=time, series_key=keys, partition_by=_partition_by(partition_by),
                               retention=retention, target_file_size=target_file_size, expected_interval=expected_interval,
                               expected_series=expected_series)
    info = {"table": table, "columns": columns.names, "time_column": time, "series_key": keys,
            "partition_tiers": [{"max_age": t.max_age, "transform": t.transform} for t in handle.contract.tiers]}
    if as_json:
        out.print_json(json.dumps(info))
    else:
        out.print(f"created {table}: columns {', '.join(columns.names)}; time {time}; series {', '.join(keys) or 'none'}")


@table_app.command("set")
def set_table(
    table: str,
    expected_interval: Annotated[str | None, typer.Option("--expected-interval", help="One row per series every …, e.g. PT1M")] = None,
    expected_series: Annotated[int | None, typer.Option("--expected-series", help="How many series the table should hold")] = None,
    warehouse: Warehouse = None, catalog: CatalogName = None,
) -> None:
    """Declare TABLE's cadence, which coverage measures days against (complete, partial, gap; without it
    a day with rows only 'has data')."""
    if expected_interval is None and expected_series is None:
        fail("nothing to set: give --expected-interval and/or --expected-series")
    _lake(warehouse, catalog).table(table).set_expected(expected_interval, expected_series)
    out.print(f"{table}: expected interval {expected_interval or 'unchanged'}, expected series {expected_series or 'unchanged'}")


@table_app.command("show")
def show_table(table: str, as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None) -> None:
    """The contract of TABLE: time column, series and dedup key, cadence, retention, partition tiers, rollups, rules,
    and how its files are written (the table's write.parquet.* properties, Iceberg's defaults where unset)."""
    from timelake.followup.coverage import EXPECTED_INTERVAL, EXPECTED_SERIES
    from timelake.followup.rollup import rollups_of
    from timelake.followup.rules import rules_of

    handle = _lake(warehouse, catalog).table(table)
    ct = handle.contract
    props = handle.iceberg.properties
    info = {"table": table, "time_column": ct.time_column, "series_key": list(ct.series_key), "dedup_key": list(ct.dedup_key),
            "expected_interval": props.get(EXPECTED_INTERVAL), "expected_series": _int_or_none(props.get(EXPECTED_SERIES)),
            "retention": ct.retention, "partition_tiers": [{"max_age": t.max_age, "transform": t.transform} for t in ct.tiers],
            "target_file_size": ct.target_file_size, "parquet": dataclasses.asdict(ct.parquet),
            "rollups": [{"interval": r.interval, "columns": list(r.columns), "table": r.table_name(table)} for r in rollups_of(handle.iceberg)],
            "rules": [r.to_json() for r in rules_of(handle.iceberg)]}
    if as_json:
        out.print_json(json.dumps(info))
        return
    for key, value in info.items():
        if key.startswith("expected_") and value is None:
            value = "not declared (coverage shows days with rows as 'has data'; set it with timelake table set)"
        out.print(f"[bold]{key}[/]: {escape(str(value))}")


def _int_or_none(text: str | None) -> int | str | None:
    return int(text) if text is not None and text.isdigit() else text


@table_app.command("declare")
def declare(
    table: str,
    rollup: Annotated[list[str] | None, typer.Option("--rollup", help="INTERVAL:COLUMN[,COLUMN…], e.g. 1h:value")] = None,
    rule: Annotated[list[str] | None, typer.Option("--rule", help=escape("'NAME: COLUMN OP THRESHOLD [for PT10M] [severity S]'"))] = None,
    warehouse: Warehouse = None, catalog: CatalogName = None,
) -> None:
    """Add rollups (built from the whole table at once) and rules to TABLE's contract."""
    rollups = []
    for item in rollup or []:
        interval, sep, columns = item.partition(":")
        if not sep:
            raise typer.BadParameter(f"'{item}' is not INTERVAL:COLUMN[,COLUMN…]", param_hint="--rollup")
        rollups.append({"interval": interval.strip(), "columns": [c.strip() for c in columns.split(",") if c.strip()]})
    with ChunkDisplay() as progress:
        _lake(warehouse, catalog).table(table).declare(rollups=rollups or None, rules=rule or None, progress=progress)
    out.print(f"{table}: declared {len(rollups)} rollup(s) and {len(rule or [])} rule(s)")


@table_app.command("events")
def table_events(
    table: str, source: Annotated[str | None, typer.Option("--source", help="live | backfill")] = None,
    as_json: JsonFlag = False, warehouse: Warehouse = None, catalog: CatalogName = None,
) -> None:
    """Rule events of TABLE (the events table), oldest first."""
    rows = [r for r in _lake(warehouse, catalog).table(table).events().to_pylist() if source is None or r["source"] == source]
    if as_json:
        out.print_json(json.dumps(rows, default=str))
        return
    print_table(["fired", "rule", "severity", "series", "started", "value", "source", "job"], [
        [f"{r['fired_at']:%Y-%m-%d %H:%M:%S}", r["rule"], r["severity"],
         ", ".join(str(v) for k, v in r.items() if k not in _EVENT_COLUMNS), f"{r['started_at']:%Y-%m-%d %H:%M:%S}",
         f"{r['value']:g}", r["source"], r["job_id"] or ""] for r in rows], f"no rule events on {table}")


_EVENT_COLUMNS = {"rule", "severity", "started_at", "fired_at", "value", "threshold", "source", "job_id", "recorded_at"}


@app.command("demo")
def demo(
    warehouse: Annotated[Path, typer.Option("--warehouse", help="Demo lake folder (recreated)")] = Path(".timelake-demo"),
) -> None:
    """Build a live table with a gap, backfill a historian export into it while a live writer runs."""
    from timelake.interfaces.demo import run_demo

    run_demo(warehouse)


def _on_aws(on: str) -> bool:
    if on not in ("local", "aws"):
        raise typer.BadParameter(f"'{on}' is not local or aws", param_hint="--on")
    return on == "aws"


def _aws() -> Any:
    from timelake.interfaces.orchestrator import from_environment

    return from_environment()


def _deployed_lake() -> Lake:
    """The deployed stack's lake (its ``LakeConfig``): Glue catalog, data bucket, jobs table."""
    from timelake.adapters import compose
    from timelake.interfaces.orchestrator import deployment

    return Lake(compose(deployment()[0]))


def _print_json_or(result: dict[str, Any], as_json: bool, verb: str) -> None:
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(f"{verb} job {result['job_id']}: execution {result['execution_arn']}"
                  + (f" ({result['how']})" if "how" in result else ""))


@functools.cache
def _command() -> Callable[[], Any]:
    """The click command behind ``app``. Typer builds it from every command's signature on each call
    (~50 ms); built once, a caller that runs many commands in one process (the fuzz test, an embedding
    program) does not pay that per command."""
    return typer.main.get_command(app)


def main() -> None:
    """The console script: the `timelake` process makes every file it creates (data, staging, job records)
    its owner's only, then runs the command. The umask is the process's, so only the command's own
    process sets it: code that calls `run` in a process of its own keeps its umask."""
    os.umask(0o077)
    run_cli()


def run_cli() -> None:
    """The command in ``sys.argv``: every failure prints one line and exits 1 instead of a traceback
    (TIMELAKE_DEBUG=1 re-raises an unexpected one, with its traceback)."""
    try:
        _command()()
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - the promise is one line for any input, a bug included
        if os.environ.get("TIMELAKE_DEBUG") and not _expected(exc):
            raise
        print(f"error: {one_line(error_text(exc))}", file=sys.stderr)
        sys.exit(1)


def _expected(exc: BaseException) -> bool:
    return isinstance(exc, BackfillError | ValueError | OSError | OverflowError | RecursionError) or _aws_text(exc) is not None


#: AWS error codes that mean the credentials, not the request, are wrong
CREDENTIAL_CODES = {"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException",
                    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthFailure", "RequestExpired"}


def _aws_text(exc: BaseException) -> str | None:
    """An AWS SDK failure as what to fix: no region, no or refused credentials, or AWS's own one-line
    reason; None for any other error. botocore is only looked at if it was loaded, which it is
    whenever one of its errors was raised."""
    errors = sys.modules.get("botocore.exceptions")
    if errors is None:
        return None
    if isinstance(exc, errors.NoRegionError):
        return "no AWS region: set AWS_DEFAULT_REGION, or a region in the AWS profile (AWS_PROFILE)"
    if isinstance(exc, errors.NoCredentialsError):
        return ("no AWS credentials: set AWS_PROFILE (after `aws configure` or `aws sso login`), or AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY")
    credentials = (errors.PartialCredentialsError, errors.ProfileNotFound, errors.CredentialRetrievalError,
                   errors.TokenRetrievalError, errors.SSOError)
    if isinstance(exc, credentials):
        return f"AWS credentials: {exc}"
    if isinstance(exc, errors.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in CREDENTIAL_CODES:
            return f"AWS refused the credentials ({code}): {exc.response['Error'].get('Message', '')}; renew them or set AWS_PROFILE"
        return f"AWS: {exc}"
    if isinstance(exc, errors.BotoCoreError):
        return f"AWS: {exc}"
    return None


def error_text(exc: BaseException) -> str:
    """What a user reads of a failure: a ValidationError's messages by field, an OS error's reason, or the
    exception's own text; an unexpected type is named so that a bug still says where it came from."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors())
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"no space left on device{f' ({exc.filename})' if exc.filename else ''}"
    aws = _aws_text(exc)
    if aws is not None:
        return aws
    if _expected(exc):
        return str(exc) or type(exc).__name__
    return f"unexpected {type(exc).__name__}: {exc}"
