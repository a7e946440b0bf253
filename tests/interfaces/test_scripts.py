"""A plain script, as pyiceberg users write them (no ``if __name__ == "__main__":``), can run a job
whose scan and writes fan out to worker processes: the workers do not run the script again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import recent


def test_a_script_without_a_main_guard_runs_a_fanned_out_job(tmp_path):
    script = tmp_path / "backfill_script.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(os.getcwd())!r})
        import timelake
        from tests.conftest import SCHEMA, make_readings
        lake = timelake.connect(warehouse={str(tmp_path / "lake")!r})
        table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"])
        job = table.backfill(source=make_readings("{recent(6)}", days=4, devices=3), max_concurrency=2).wait()
        print(job.report()["rows_written"], table.to_arrow().num_rows)
        import pyarrow.parquet as pq
        import timelake.steps.plan
        timelake.steps.plan.MIN_TASK_BYTES = 1  # a task per file, so the scan fans out too
        for day in range(4):
            pq.write_table(make_readings("{recent(6)}", days=4, devices=3).slice(day * 72, 72), {str(tmp_path)!r} + f"/d{{day}}.parquet")
        files = lake.create_table("iot.files", schema=SCHEMA, time_column="ts", series_key=["device_id"])
        job = files.backfill(source={str(tmp_path)!r} + "/*.parquet", max_concurrency=2).wait()
        print(len(job.record().state["scan_tasks"]), job.report()["rows_written"], files.to_arrow().num_rows)
    """))
    env = {**os.environ, "TIMELAKE_IN_PROCESS_ROWS": "0", "TIMELAKE_IN_PROCESS_SOURCE_BYTES": "0", "TIMELAKE_THREAD_WRITERS": "0"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["288", "288", "4", "288", "288"]
