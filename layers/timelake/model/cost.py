"""What a job will cost, before it runs: local wall time and an AWS bill, with the assumptions shown.

The numbers are estimates from fixed throughput and list prices (us-east-1, arm64); the report
prints the assumptions so a reader can redo the arithmetic with their own.
"""

from __future__ import annotations

import os
from typing import Any

ASSUMPTIONS: dict[str, float] = {
    "local_rows_per_second_per_core": 600_000,  # measured end to end by bench/bench_backfill.py on 2 cores
    "lambda_rows_per_second": 500_000,
    "lambda_overhead_seconds_per_unit": 2.0,
    "lambda_memory_gb": 3.0,
    "lambda_usd_per_gb_second_arm64": 0.0000133334,
    "lambda_usd_per_million_requests": 0.20,
    "lambda_invocations_per_unit": 2,  # its write and the check of its file
    "stepfunctions_usd_per_1000_transitions": 0.025,
    "stepfunctions_transitions_per_unit": 12,  # about 6 for each of its two Map items (write, check): with the Task, the quiet-hours Choice and the item's end state
    "stepfunctions_transitions_per_job": 20,
    "s3_usd_per_1000_put": 0.005,
    "s3_usd_per_1000_get": 0.0004,
    "s3_puts_per_unit": 2,
    "s3_gets_per_unit": 4,
}


def estimate_cost(rows: int, units: int, max_concurrency: int | None) -> dict[str, Any]:
    a = ASSUMPTIONS
    cores = max(1, min(max_concurrency or os.cpu_count() or 1, os.cpu_count() or 1))
    local_seconds = rows / (a["local_rows_per_second_per_core"] * cores)
    lambda_seconds = units * a["lambda_overhead_seconds_per_unit"] + rows / a["lambda_rows_per_second"]
    lambda_usd = lambda_seconds * a["lambda_memory_gb"] * a["lambda_usd_per_gb_second_arm64"]
    lambda_usd += (units * a["lambda_invocations_per_unit"] + 6) * a["lambda_usd_per_million_requests"] / 1e6
    sfn_usd = (units * a["stepfunctions_transitions_per_unit"] + a["stepfunctions_transitions_per_job"]) * a[
        "stepfunctions_usd_per_1000_transitions"
    ] / 1000
    s3_usd = units * (a["s3_puts_per_unit"] * a["s3_usd_per_1000_put"] + a["s3_gets_per_unit"] * a["s3_usd_per_1000_get"]) / 1000
    return {
        "local_wall_seconds": round(local_seconds, 2),
        "local_cores": cores,
        "aws_usd": round(lambda_usd + sfn_usd + s3_usd, 6),
        "aws_breakdown_usd": {"lambda": round(lambda_usd, 6), "stepfunctions": round(sfn_usd, 6), "s3": round(s3_usd, 6)},
        "assumptions": dict(a),
    }
