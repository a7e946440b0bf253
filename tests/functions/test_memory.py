"""Each Lambda handler fits its function's memory with the largest input the planner hands it.

Every handler runs in its own process inside a cgroup (v1 memory controller) whose limit is the
function's ``MemorySize`` in the synthesized template, as a Lambda would: above it the kernel kills
the process. The input is one day of 23,000 devices at 1/min (33.1M rows of the benchmark's shape,
one source file): the scan reads it as one piece, the cut makes it one unit at the 128 MB target,
validate_item checks that one file, validate combines its facts and runs a SQL assertion over it,
publish commits it and the rollup handler refreshes that day. Then merge mode at its heaviest: the
same day again, every key already on main, so the writer holds the whole unit and reads all of
main's day against it; and replace mode's diff: the main task reads and spills main's day, the writer
compares the day's unit with it key by key, the stage step combines the cells. Each handler must
finish with a peak RSS of at most 80 % of its limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import SCHEMA
from timelake.interfaces.service import begin, list_checks
from timelake.model.spec import JobSpec
from timelake.model.timeutil import iso
from timelake.steps.abort import abort
from timelake.steps.diff import pending_main_tasks
from timelake.steps.plan import cut, scan
from timelake.steps.stage import stage
from timelake.steps.validate import check_items

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CGROUPS = Path("/sys/fs/cgroup/memory")
DEVICES, MINUTES = 23_000, 1_440
HEADROOM = 0.8
CHILD = """
import json, sys, importlib.util
spec = importlib.util.spec_from_file_location("app", sys.argv[1])
app = importlib.util.module_from_spec(spec)
spec.loader.exec_module(app)

class Context:
    function_name, function_version, memory_limit_in_mb = "timelake-" + sys.argv[3], "$LATEST", int(sys.argv[4])
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:" + function_name
    aws_request_id, log_group_name, log_stream_name = "memory-test", "/aws/lambda/" + function_name, "test"
    def get_remaining_time_in_millis(self):
        return 900_000

print("RESULT " + json.dumps(app.handler(json.loads(sys.argv[2]), Context()), default=str))
"""


@dataclass
class Run:
    name: str
    limit_mb: int
    peak_mb: float
    status: int
    output: str
    seconds: float

    @property
    def result(self) -> dict[str, Any]:
        line = next((ln for ln in self.output.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, f"{self.name} gave no result (exit status {self.status}): {self.output[-2000:]}"
        return json.loads(line.removeprefix("RESULT "))

    def fits(self) -> None:
        killed = " (killed: out of memory)" if os.WIFSIGNALED(self.status) and os.WTERMSIG(self.status) == 9 else ""
        assert os.WIFEXITED(self.status) and os.WEXITSTATUS(self.status) == 0, \
            f"{self.name} failed under {self.limit_mb} MB{killed}: {self.output[-2000:]}"
        assert self.peak_mb <= HEADROOM * self.limit_mb, \
            f"{self.name} peaked at {self.peak_mb:.0f} MB, over {HEADROOM:.0%} of its {self.limit_mb} MB"


def memory_sizes(template: dict[str, Any]) -> dict[str, int]:
    """MemorySize per function name, from the template (functions are told apart by their description)."""
    sizes = {}
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Function" and props.get("Description", "").startswith("timelake backfill: "):
            sizes[props["Description"].removeprefix("timelake backfill: ").replace(" ", "_")] = props["MemorySize"]
    return sizes


def run_handler(name: str, event: dict[str, Any], limit_mb: int, env: dict[str, str], label: str | None = None) -> Run:
    """``functions/<name>/app.py`` on ``event`` in a child process held to ``limit_mb`` by a memory cgroup,
    with the memory size in the environment as Lambda sets it."""
    group = CGROUPS / f"timelake-{name}-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(limit_mb << 20))
        procs = str(group / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

        started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(ROOT / "functions" / name / "app.py"), json.dumps(event), name, str(limit_mb)],
            env={**env, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(limit_mb)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, preexec_fn=enter)
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = status
        return Run(label or name, limit_mb, usage.ru_maxrss / 1024, status, output, time.monotonic() - started)
    finally:
        group.rmdir()


def write_source(path: Path) -> int:
    """One Parquet file with a day of every device at 1/min, written a slice of devices at a time."""
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
    minutes = np.datetime64(start.replace(tzinfo=None), "us") + np.arange(MINUTES) * np.timedelta64(60, "s")
    with pq.ParquetWriter(path, SCHEMA) as writer:
        for first in range(0, DEVICES, 1_000):
            devices = pa.array([f"dev-{i:05d}" for i in range(first, min(first + 1_000, DEVICES))])
            values = np.random.default_rng(first).normal(20, 5, len(devices) * MINUTES).round(3)
            writer.write_table(pa.table({"ts": pa.array(np.tile(minutes, len(devices))).cast(SCHEMA.field("ts").type),
                                         "device_id": devices.take(np.repeat(np.arange(len(devices)), MINUTES)),
                                         "value": values}, schema=SCHEMA))
    return DEVICES * MINUTES


@pytest.fixture(scope="module")
def limits(synthesized) -> dict[str, int]:  # noqa: F811
    return memory_sizes(synthesized.template)


def test_every_handler_fits_its_memory_with_the_largest_input(tmp_path, limits):
    if not os.access(CGROUPS, os.W_OK):
        pytest.fail(f"{CGROUPS} is not writable: these tests need the cgroup v1 memory controller (run as root)")
    source = tmp_path / "day.parquet"
    rows = write_source(source)
    lake = timelake.connect(warehouse=tmp_path / "lake")
    lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                      rollups=[{"interval": "1h", "columns": ["value"]}])
    rt = lake.runtime
    env = {**os.environ, "TIMELAKE_CONFIG": rt.config.model_dump_json(), "POWERTOOLS_TRACE_DISABLED": "true",
           "POWERTOOLS_SERVICE_NAME": "timelake-backfill", "POWERTOOLS_METRICS_NAMESPACE": "Timelake",
           "POWERTOOLS_METRICS_DISABLED": "true"}
    every_device_every_minute = f"SELECT device_id, count(*) AS n FROM staged GROUP BY device_id HAVING n <> {MINUTES}"
    job = JobSpec(table="iot.sensor", source=str(source), assertions=[every_device_every_minute])
    runs = [run_handler("plan", {"job": job.to_json(), "execution_name": job.job_id}, limits["plan"], env)]
    runs[-1].fits()
    runs += [run_handler("scan", {"job_id": job.job_id, "piece": 0}, limits["scan"], env)]
    runs[-1].fits()
    assert runs[-1].result["rows"] == rows
    cut(rt, job.job_id)
    units = rt.store.units(job.job_id)
    assert len(units) == 1, "the day is one unit at the 128 MB target: the largest unit the planner makes"
    runs.append(run_handler("write", {"job_id": job.job_id, "unit_id": units[0].unit_id}, limits["write"], env))
    runs[-1].fits()
    assert runs[-1].result["rows_written"] == rows
    stage(rt, job.job_id)
    assert list_checks(rt, job.job_id)["files"] == 1
    (item,) = check_items(rt, job.job_id)
    runs.append(run_handler("validate_item", item, limits["validate_item"], env))
    runs[-1].fits()
    assert runs[-1].result["passed"]
    for name, event in (("validate", {"job_id": job.job_id, "action": "conclude"}), ("publish", {"job_id": job.job_id})):
        runs.append(run_handler(name, event, limits[name], env))
        runs[-1].fits()
    checks = {c["name"]: c for c in rt.store.get_job(job.job_id).state["checks"]}
    assert checks["assertion_1"]["passed"] and checks["files_sorted"]["passed"], checks
    published = rt.store.get_job(job.job_id)
    assert published.phase == "published" and rt.load_table("iot.sensor").scan().count() == rows
    detail = {"job_id": job.job_id, "table": "iot.sensor", "start": iso(published.state["range_start"]),
              "end": iso(published.state["range_end"])}
    runs.append(run_handler("rollup", {"detail": detail}, limits["rollup"], env))
    runs[-1].fits()

    again = JobSpec(table="iot.sensor", source=str(source), mode="merge")
    begin(rt, again)
    scan(rt, again.job_id, 0)
    cut(rt, again.job_id)
    (unit,) = rt.store.units(again.job_id)
    runs.append(run_handler("write", {"job_id": again.job_id, "unit_id": unit.unit_id}, limits["write"], env, "write (merge)"))
    runs[-1].fits()
    written = rt.store.unit(again.job_id, unit.unit_id).result
    assert (written["rows_written"], written["rows_conflicting_existing"]) == (0, rows)  # main already holds every key

    # replace mode's diff at its heaviest: main's whole day read by its main task and spilled, then compared
    # key by key with the day's unit, which holds its rows and reads main's against them; stage combines
    abort(rt, again.job_id)  # its lease would refuse the next job on the day
    fixed = JobSpec(table="iot.sensor", source=str(source), mode="replace")
    begin(rt, fixed)
    scan(rt, fixed.job_id, 0)
    cut(rt, fixed.job_id)
    for task in pending_main_tasks(rt, fixed.job_id):
        runs.append(run_handler("write", {"job_id": fixed.job_id, "main_task": task}, limits["write"], env, "main task"))
        runs[-1].fits()
    (unit,) = rt.store.units(fixed.job_id)
    runs.append(run_handler("write", {"job_id": fixed.job_id, "unit_id": unit.unit_id}, limits["write"], env, "write (replace)"))
    runs[-1].fits()
    runs.append(run_handler("stage", {"job_id": fixed.job_id}, limits["stage"], env, "stage (diff)"))
    runs[-1].fits()
    assert rt.store.get_job(fixed.job_id).state["diff_job"]["totals"]["in_both"] == rows  # every key on both sides
    print("\n".join(f"{r.name:<14} {r.peak_mb:7.0f} MB of {r.limit_mb} MB ({r.peak_mb / r.limit_mb:.0%}) in {r.seconds:.1f} s"
                    for r in runs))
