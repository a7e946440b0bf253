"""The Python API: `connect()` → `Lake` → `Table` with verbs → `Job` handles, in pyiceberg's manner."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform

from timelake.adapters import compose
from timelake.errors import BackfillError, CatalogUnsupported
from timelake.followup import completion
from timelake.followup.coverage import EXPECTED_INTERVAL, EXPECTED_SERIES, CoverageMap, fixed_interval
from timelake.followup.coverage import compute as compute_coverage
from timelake.followup.rollup import ROLLUPS, rollups_of
from timelake.followup.rollup import create_tables as create_rollup_tables
from timelake.followup.rollup import parse as parse_rollups
from timelake.followup.rollup import refresh as refresh_rollups
from timelake.followup.rollup import to_property as rollups_property
from timelake.followup.rules import RULES, evaluate_live, events_table_name, rules_of
from timelake.followup.rules import parse as parse_rules
from timelake.followup.rules import to_property as rules_property
from timelake.model import contract as c
from timelake.model.commit import with_retry
from timelake.model.layout import read_range, time_bounds
from timelake.model.report import progress_of, report_of
from timelake.model.spec import SETTINGS, JobSpec, current_setting
from timelake.model.timeutil import iso, parse_duration, parse_instant, parse_size, subtract_duration, to_micros
from timelake.ports.alarms import AlarmSink
from timelake.ports.events import EventBus
from timelake.ports.runtime import DEFAULT_WAREHOUSE, LakeConfig, Runtime, local_state
from timelake.ports.store import JobRecord, Lease, Phase
from timelake.runner import run_job
from timelake.steps.abort import abort, request_abort
from timelake.steps.canary import approve as approve_canary
from timelake.steps.diff import find as find_diff
from timelake.steps.schedule import change_settings


def expected_properties(interval: str | None, series: int | None) -> dict[str, str]:
    """The table properties of a declared cadence, checked (a fixed duration, a positive count)."""
    props = {}
    if interval is not None:
        fixed_interval(interval)
        props[EXPECTED_INTERVAL] = interval.strip().upper()
    if series is not None:
        if isinstance(series, bool) or not isinstance(series, int) or series < 1:
            raise ValueError(f"expected series must be a positive whole number, not {series!r}")
        props[EXPECTED_SERIES] = str(series)
    return props


def connect(
    warehouse: str | os.PathLike[str] | None = None, catalog: str | None = None, *, bus: EventBus | None = None,
    store: str | None = None, staging: str | None = None, alarms: AlarmSink | None = None,
    properties: dict[str, str] | None = None, **catalog_props: str,
) -> Lake:
    """The embedded lake in ``warehouse`` (default ``./.timelake`` or $TIMELAKE_WAREHOUSE), or the tables of
    the pyiceberg catalog named ``catalog`` (default $TIMELAKE_CATALOG), found as pyiceberg's own
    ``load_catalog(catalog)`` finds it: ``.pyiceberg.yaml`` and ``PYICEBERG_CATALOG__<NAME>__*``
    variables, overridden by ``properties`` and ``catalog_props`` (``properties`` holds those that
    clash with this function's own names, such as the catalog's ``warehouse``). With a named catalog only the catalog changes: job
    records (``store``) and scratch files (``staging``) stay in the warehouse folder. ``alarms``
    receives the live path's real-time alarms (default: kept in process)."""
    folder = warehouse or os.environ.get("TIMELAKE_WAREHOUSE", DEFAULT_WAREHOUSE)
    catalog = catalog or os.environ.get("TIMELAKE_CATALOG") or None
    if catalog is None:
        config = LakeConfig.embedded(folder)
    else:
        config = LakeConfig.named(catalog, folder, store=store, staging=staging,
                                  props={**(properties or {}), **catalog_props})
    return Lake(compose(config, bus, alarms), named=catalog is not None)


def job_catalog(job_id: str, warehouse: str | os.PathLike[str] | None = None) -> str | None:
    """The catalog a job recorded in the warehouse folder's job store was started on, by name (None:
    the embedded lake's own); read from the store alone, no catalog is opened."""
    from timelake.adapters import store_for

    store, _ = local_state(warehouse or os.environ.get("TIMELAKE_WAREHOUSE", DEFAULT_WAREHOUSE))
    return store_for(store).get_job(job_id).spec.get("catalog")


class Lake:
    def __init__(self, runtime: Runtime, named: bool = False) -> None:
        """``named``: the catalog was chosen by name (`connect(catalog=...)`), so the jobs made here record
        it; a lake built on a runtime directly (the AWS stack's, tests) leaves that to the runtime."""
        self.runtime = runtime
        self.catalog_name = runtime.config.catalog_name if named else None

    @property
    def catalog(self) -> Any:
        return self.runtime.catalog

    def create_table(
        self, name: str, schema: pa.Schema | Schema, time_column: str, series_key: Iterable[str] = (),
        partition_by: str | dict[str | None, str] = "day", retention: str | None = None,
        target_file_size: str | int = "128MB", dedup_key: Iterable[str] | None = None,
        properties: dict[str, str] | None = None, rollups: list[dict[str, Any]] | None = None,
        rules: list[dict[str, Any] | str] | None = None, expected_interval: str | None = None,
        expected_series: int | None = None,
    ) -> Table:
        """Create an Iceberg table that carries its timelake contract in its properties.

        ``partition_by`` may give coarser partitions for older data, e.g.
        ``{"P90D": "day", "P2Y": "month", None: "year"}``: each tier is a partition spec of the table
        (the youngest is the default spec, used by live writes). ``expected_interval`` (e.g. ``PT1M``)
        and ``expected_series`` are the cadence coverage needs to tell a complete day from a partial one.
        """
        properties = {**(properties or {}), **expected_properties(expected_interval, expected_series)}
        series = list(series_key)
        tiers = c.normalize_tiers(partition_by)
        if retention:
            parse_duration(retention)
        iceberg_schema = _iceberg_schema(schema, time_column, series)
        dedup = list(dedup_key) if dedup_key else [*series, time_column]
        missing = [k for k in [*series, *dedup] if k not in iceberg_schema.column_names]
        if missing:
            raise ValueError(f"create_table {name}: column(s) {missing} are not in the schema ({iceberg_schema.column_names})")
        if not set([*series, time_column]) <= set(dedup):
            raise ValueError(f"create_table {name}: the dedup key must contain the series key and the time column")
        namespace = name.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        time_field = iceberg_schema.find_field(time_column)
        sort_order = SortOrder(*[SortField(source_id=iceberg_schema.find_field(k).field_id, transform=IdentityTransform())
                                 for k in [*series, time_column]])
        oldest = tiers[-1][1]
        props = {
            c.TIME_COLUMN: time_column, c.SERIES_KEY: ",".join(series), c.DEDUP_KEY: ",".join(dedup),
            c.TARGET_FILE_SIZE: str(parse_size(target_file_size)), "write.parquet.compression-codec": "zstd",
            **({c.RETENTION: retention} if retention else {}), **(properties or {}),
        }
        declared = parse_rollups(rollups, iceberg_schema.as_arrow())
        if declared:
            props[ROLLUPS] = rollups_property(declared)
        if rules:
            props[RULES] = rules_property(parse_rules(rules, iceberg_schema.as_arrow()))
        table = self.catalog.create_table(
            name, schema=iceberg_schema, sort_order=sort_order, properties=props,
            partition_spec=PartitionSpec(PartitionField(time_field.field_id, 1000, c.TRANSFORM_CLASSES[oldest](), f"{time_column}_{oldest}")),
        )
        spec_ids = {oldest: table.spec().spec_id}
        previous = oldest
        for _, transform in reversed(tiers[:-1]):
            with table.update_spec() as update:
                update.add_field(time_column, c.TRANSFORM_CLASSES[transform](), f"{time_column}_{transform}")
                update.remove_field(f"{time_column}_{previous}")
            table = table.refresh()
            spec_ids[transform] = table.spec().spec_id
            previous = transform
        if declared:
            create_rollup_tables(self.runtime, name, c.Contract.from_table(table), iceberg_schema.as_arrow(), declared)
        if len(tiers) > 1:
            with table.transaction() as tx:
                tx.set_properties({c.PARTITION_TIERS: json.dumps(
                    [{"max_age": age, "transform": t, "spec_id": spec_ids[t]} for age, t in tiers])})
        return self.table(name)

    def table(self, name: str) -> Table:
        return Table(self, self.runtime.load_table(name))

    def job(self, job_id: str) -> Job:
        """A handle on a recorded job; one started on another catalog is refused (its table, branch and
        files are there, not here)."""
        recorded = self.runtime.store.get_job(job_id).spec.get("catalog")
        mine = self.runtime.config.catalog_name
        if (recorded is not None and recorded != mine) or (recorded is None and self.catalog_name is not None):
            here = "the embedded lake" if mine == "timelake" and self.catalog_name is None else f"catalog '{mine}'"
            raise CatalogUnsupported(f"job {job_id} was started on {f'catalog {recorded!r}' if recorded else 'the embedded lake'}, "
                                     f"not on {here}: "
                                     + (f"use --catalog {recorded} (TIMELAKE_CATALOG, timelake.connect(catalog=...))"
                                        if recorded else "leave out --catalog (and TIMELAKE_CATALOG)"))
        return Job(self, job_id)

    def jobs(self, table: str | None = None) -> list[Job]:
        return [Job(self, j.job_id) for j in self.runtime.store.list_jobs(table)]

    def create_job(self, spec: JobSpec) -> Job:
        """Record a job (phase ``created``) without running it. The record names the catalog (when one
        was chosen by name), so a resume, a status or an abort finds the job's table again."""
        self.runtime.check_catalog(spec.catalog)
        if not spec.dry_run:
            self.runtime.require_commits()
        self.runtime.load_table(spec.table)
        spec = spec.model_copy(update={"catalog": self.catalog_name})
        self.runtime.store.create_job(JobRecord(spec.job_id, spec.table, Phase.CREATED, spec.to_json()))
        return Job(self, spec.job_id)

    def leases(self, table: str | None = None) -> list[Lease]:
        """Ranges held by unpublished backfills (all tables, or one)."""
        return self.runtime.store.leases(table)

    def is_range_leased(self, table: str, start: str | datetime, end: str | datetime) -> bool:
        """Whether an unpublished backfill holds any part of [start, end) of ``table``.

        The contract for compactors and other maintenance: before rewriting a partition, ask for
        its time range and skip it while this is True; the backfill will publish already-compacted
        files there, and a rewrite in between would only be thrown away or conflict.
        """
        lo, hi = to_micros(parse_instant(start)), to_micros(parse_instant(end))
        return any(lease.start < hi and lease.end > lo for lease in self.runtime.store.leases(table))

    def submit(self, spec: JobSpec, source: Any = None, wait: bool = False) -> Job:
        """Create the job record and start it on a background thread (``wait`` runs it inline)."""
        job = self.create_job(spec)
        job._start(source, background=not wait)
        return job


class Table:
    def __init__(self, lake: Lake, iceberg: IcebergTable) -> None:
        self.lake = lake
        self.iceberg = iceberg
        self.name = ".".join(iceberg.name()[-2:])

    @property
    def contract(self) -> c.Contract:
        return c.Contract.from_table(self.iceberg)

    def refresh(self) -> Table:
        self.iceberg = self.iceberg.refresh()
        return self

    def append(self, data: pa.Table | Any, as_backfill: bool = False, older_than: str = "PT6H",
               evaluate_rules: bool = True, update_coverage: bool = False) -> Job | None:
        """The plain live write path (one commit): what a live ingester does.

        The appended rows are evaluated against the table's rules in real time (``evaluate_rules``):
        events that fire go to the events table and the lake's alarm sink. With ``as_backfill=True`` the rows older than ``older_than`` (a gateway's buffered dump after an
        outage) go through a backfill job instead (merge: existing rows win), written sorted and sized
        into their old partitions rather than as small files; the recent rest is appended as usual.
        With ``update_coverage=True`` the partitions it wrote are refreshed in the companion coverage
        table (a publish always does this). Returns the backfill job when there was one.
        """
        rows = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
        rows = rows.cast(self.iceberg.schema().as_arrow())
        job = None
        if as_backfill:
            cutoff = to_micros(subtract_duration(datetime.now(UTC), older_than))
            old = pc.less(pc.cast(rows.column(self.contract.time_column), pa.int64()), cutoff)
            if pc.any(old).as_py():
                job = self.backfill(source=rows.filter(old)).wait()
                rows = rows.filter(pc.invert(old))
        if rows.num_rows:
            def append(table: IcebergTable) -> IcebergTable:
                table.append(rows)
                return table.refresh()

            self.iceberg = with_retry(self.iceberg.refresh(), append, "append")
            if evaluate_rules:
                evaluate_live(self.lake.runtime, self.name, rows)
            if update_coverage:
                ts = pc.cast(rows.column(self.contract.time_column), pa.int64())
                completion.update(self.lake.runtime, self.name, pc.min(ts).as_py(), pc.max(ts).as_py() + 1)
        return job

    def coverage(self, start: str | datetime | None = None, end: str | datetime | None = None) -> pa.Table:
        """The completion signal: the companion table's rows (partition, rows, expected, status,
        last_writer, updated_at) for partitions starting in [start, end), as Arrow."""
        return completion.read(self.lake.runtime, self.name, start, end)

    def coverage_map(
        self, start: str | datetime | None = None, end: str | datetime | None = None, by: str = "day", series: bool = False,
    ) -> CoverageMap:
        """Coverage computed now from the table's metadata, per hour/day/month bucket (see `coverage`)."""
        return compute_coverage(self.lake.runtime, self.name, start, end, by=by, series=series)

    def declare(self, rollups: list[dict[str, Any]] | None = None, rules: Sequence[dict[str, Any] | str] | None = None,
                progress: Callable[[int, int, str], None] | None = None) -> Table:
        """Add rollups and rules to the contract of an existing table (a rule of the same name is
        replaced). A new rollup's table is created and built from the whole base table at once, so it
        is complete from the start rather than only over ranges backfilled later; on a long table that
        takes a while, and ``progress(chunks done, chunks in all, rollup table)`` hears of each chunk."""
        self.refresh()
        schema = self.iceberg.schema().as_arrow()
        known = rollups_of(self.iceberg)
        new = [r for r in parse_rollups(rollups, schema) if r.interval not in {k.interval for k in known}]
        updated = {r.name: r for r in [*rules_of(self.iceberg), *parse_rules(rules, schema)]}
        props = {RULES: rules_property(list(updated.values()))} if rules else {}
        if new:
            create_rollup_tables(self.lake.runtime, self.name, self.contract, schema, new)
            props[ROLLUPS] = rollups_property([*known, *new])
        if props:
            with self.iceberg.transaction() as tx:
                tx.set_properties(props)
            self.refresh()
        bounds = time_bounds(self.iceberg, self.contract.time_column)
        if new and bounds is not None:
            refresh_rollups(self.lake.runtime, self.name, iso(bounds[0]), iso(bounds[1] + 1), progress)
        return self

    def set_expected(self, interval: str | None = None, series: int | None = None) -> Table:
        """Declare the cadence coverage measures against: one row per series every ``interval`` (e.g.
        ``PT1M``), for ``series`` series. Without them coverage cannot tell a complete bucket from a short
        one: a bucket with rows only "has data"."""
        props = expected_properties(interval, series)
        if props:
            with self.iceberg.transaction() as tx:
                tx.set_properties(props)
            self.refresh()
        return self

    def events(self) -> pa.Table:
        """The rule events of this table (live and backfill), oldest first; empty if none fired yet."""
        try:
            return self.lake.catalog.load_table(events_table_name(self.name)).scan().to_arrow().sort_by("fired_at")
        except NoSuchTableError:
            return pa.table({})

    def to_arrow(self, start: str | datetime | None = None, end: str | datetime | None = None, ref: str | None = None) -> pa.Table:
        """Rows of main (or ``ref``) in [start, end), sorted by series key and time."""
        self.refresh()
        ct = self.contract
        lo = to_micros(parse_instant(start)) if start is not None else None
        hi = to_micros(parse_instant(end)) if end is not None else None
        rows = read_range(self.iceberg, ct.time_column, lo, hi, ref=ref)
        return rows.sort_by([(k, "ascending") for k in (*ct.series_key, ct.time_column)])

    def history(self) -> pa.Table:
        """Published backfills of this table (rows of ``timelake.backfills``), oldest first."""
        from timelake.followup.provenance import history

        return history(self.lake.runtime, self.name)

    def backfill(
        self, source: Any, map: dict[str, str] | None = None, tz: str | None = None, mode: str = "merge",  # noqa: A002
        start: str | datetime | None = None, end: str | datetime | None = None, dry_run: bool = False,
        publish_by: str | None = None, max_concurrency: int | None = None, assertions: Iterable[str] = (),
        wait: bool = False, **options: Any,
    ) -> Job:
        """Start a backfill of ``source`` (path/glob/URI, pyarrow Table or reader, pandas DataFrame).

        ``options`` are the job's other fields by their JobSpec names (``evaluate_rules``, ``canary``,
        ``query``, ``measurement``, ``source_rows_per_second``, ...; see the job schema): one model,
        so the Python API, the CLI and the job JSON cannot drift apart, and a misspelt name is an error.
        Returns at once with a `Job`; ``job.wait()`` blocks until it ends and raises if it failed.
        """
        in_memory = not isinstance(source, str | os.PathLike)
        spec = JobSpec.model_validate({
            "table": self.name, "source": _describe(source) if in_memory else str(source),
            "map": map or {}, "tz": tz, "mode": mode, "start": start, "end": end, "dry_run": dry_run,
            "publish_by": publish_by, "max_concurrency": max_concurrency, "assertions": list(assertions), **options,
        })
        return self.lake.submit(spec, source if in_memory else None, wait=wait)


def _describe(source: Any) -> str:
    rows = getattr(source, "num_rows", None) or (len(source) if hasattr(source, "__len__") else "?")
    return f"<{type(source).__module__.split('.')[0]}.{type(source).__name__} {rows} rows>"


class Job:
    """A handle on a backfill job; all state lives in the job store, so handles are cheap and stateless."""

    def __init__(self, lake: Lake, job_id: str) -> None:
        self.lake = lake
        self.id = job_id
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        return f"Job({self.id!r}, phase={str(self.record().phase)!r})"

    def record(self) -> JobRecord:
        return self.lake.runtime.store.get_job(self.id)

    def _start(self, source: Any, background: bool) -> None:
        def target() -> None:
            try:
                run_job(self.lake.runtime, self.id, source)
            except BaseException as exc:  # surfaced by wait()
                self._error = exc

        if background:
            self._thread = threading.Thread(target=target, name=f"backfill-{self.id}", daemon=True)
            self._thread.start()
        else:
            target()

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the job ends; re-raise its error (BackfillError subclasses name what went wrong)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"job {self.id} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def status(self) -> dict[str, Any]:
        store = self.lake.runtime.store
        return progress_of(store, self.id)

    def report(self) -> dict[str, Any]:
        store = self.lake.runtime.store
        return report_of(store, self.id)

    def diff(self) -> dict[str, Any]:
        """What the job changes in its range (replace and merge; a dry run's prediction, a waiting
        canary's day): totals, per column, per day, the most changed series and sample rows side by side,
        with every (day, series) cell as an Arrow table under ``cells`` (None when only the summary in
        ``timelake.backfills`` is left)."""
        summary, cells = find_diff(self.lake.runtime, self.id)
        return {**summary, "cells": cells}

    def abort(self) -> dict[str, Any]:
        """Stop the job and remove every trace of it that is not on main (branch, files, lease)."""
        request_abort(self.lake.runtime, self.id)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()
            self._error = None
        return abort(self.lake.runtime, self.id) if self.record().phase != Phase.ABORTED else {
            "job_id": self.id, "phase": Phase.ABORTED, "files_deleted": self.record().state.get("files_deleted", 0)}

    def set(self, max_concurrency: int | None = None, source_rows_per_second: int | None = None) -> dict[str, Any]:
        """Change how fast the job works while it runs: writers and scan tasks at once (from the next unit
        to start) and the source's rows per second (from the next rows read; 0: no limit). A finished job
        is refused; a failed or interrupted one keeps them for its resume. Returns the job's settings."""
        job = change_settings(self.lake.runtime, self.id, max_concurrency=max_concurrency,
                              source_rows_per_second=source_rows_per_second)
        return {"job_id": self.id, "settings": {name: current_setting(job, name) for name in SETTINGS}}

    def approve(self, wait: bool = False) -> Job:
        """Accept the canary day: write the other units (the canary's files stay as they are), stage,
        validate the whole job and publish. Returns at once unless ``wait``; ``wait()`` joins."""
        approve_canary(self.lake.runtime, self.id, in_time=True)
        self.resume()
        return self.wait() if wait else self

    def resume(self, source: Any = None, wait: bool = False) -> Job:
        """Continue from the first unfinished step; done units are skipped. Safe to call repeatedly."""
        phase = self.record().phase
        if phase == Phase.ABORTED:
            raise BackfillError(f"job {self.id} was aborted; start a new job")
        if phase == Phase.FAILED_VALIDATION:
            raise BackfillError(f"job {self.id} failed validation; nothing was published. Fix the source and start a new job")
        self._error = None
        self._start(source, background=not wait)
        return self.wait() if wait else self


def _iceberg_schema(schema: pa.Schema | Schema, time_column: str, required: list[str]) -> Schema:
    """An Iceberg schema from Arrow with fresh field ids; the time column becomes timestamptz (UTC µs)."""
    if isinstance(schema, Schema):
        return schema
    from timelake.model.iceberg_private import fresh_schema

    if time_column not in schema.names:
        raise ValueError(f"time column '{time_column}' is not in the schema ({schema.names})")
    fields = []
    for f in schema:
        if f.name == time_column:
            f = pa.field(f.name, pa.timestamp("us", tz="UTC"), nullable=False)
        elif f.name in required:
            f = f.with_nullable(False)
        fields.append(f)
    return fresh_schema(pa.schema(fields))
