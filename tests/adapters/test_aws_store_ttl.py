"""DynamoDB keeps one item per unit; once a job is finished they are marked to expire (the table's
TTL), so the jobs table does not grow with every job ever run. The job item itself stays."""

from __future__ import annotations

import time

import boto3
import pytest

from tests.aws_fixtures import aws, dynamo_table, moto_server  # noqa: F401
from timelake.adapters import compose
from timelake.aws.store import TTL_ATTRIBUTE, DynamoJobStore
from timelake.ports.runtime import LakeConfig
from timelake.ports.store import TERMINAL, JobRecord, UnitRecord


def expiries(table: str, job_id: str) -> dict[str, int | None]:
    items = boto3.client("dynamodb").query(
        TableName=table, KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": f"JOB#{job_id}"}})["Items"]
    return {i["sk"]["S"]: int(i[TTL_ATTRIBUTE]["N"]) if TTL_ATTRIBUTE in i else None for i in items}


@pytest.mark.usefixtures("aws")
@pytest.mark.parametrize("finished", ["published", "aborted"])  # batched rewrites, and one update per unit
def test_units_of_a_finished_job_expire_after_the_configured_days_and_a_failed_jobs_do_not(finished: str) -> None:
    table = dynamo_table("jobs")
    store = DynamoJobStore(table, unit_ttl_days=7)
    for job_id in ("done", "failed"):
        store.create_job(JobRecord(job_id, "iot.a", "planned", {}))
        store.put_units(job_id, [UnitRecord(f"u{i}", {"n": i}) for i in range(30)])  # more than one batch of 25
    store.update_job("failed", "failed", error="boom")
    assert set(expiries(table, "failed").values()) == {None}, "a failed job resumes from its units"
    before = time.time()
    store.update_job("done", "publishing")
    assert set(expiries(table, "done").values()) == {None}
    store.complete_unit("done", "u7", {"rows": 7})
    job = store.update_job("done", finished)
    assert finished in TERMINAL
    got = expiries(table, "done")
    assert got.pop("JOB") is None, "the job item (its report) stays"
    assert len(got) == 30 and set(got.values()) == {int(job.updated_at + 7 * 86_400)}
    assert before + 7 * 86_400 - 1 <= next(iter(got.values())) <= time.time() + 7 * 86_400
    units = store.units("done")  # still readable, unchanged, until DynamoDB deletes them
    assert sorted(u.unit_id for u in units) == sorted(f"u{i}" for i in range(30)) and all(u.info == {"n": int(u.unit_id[1:])} for u in units)
    assert [(u.unit_id, u.status, u.result) for u in units if u.status == "done"] == [("u7", "done", {"rows": 7})]


@pytest.mark.usefixtures("aws")
def test_the_store_url_carries_the_ttl_and_rejects_unknown_options(tmp_path) -> None:
    table = dynamo_table("jobs")
    config = {"catalog_name": "lake", "catalog_props": {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}"},
              "staging": str(tmp_path / "staging")}
    assert compose(LakeConfig.model_validate({**config, "store": f"dynamodb://{table}?unit_ttl_days=12"})).store.unit_ttl_days == 12
    assert compose(LakeConfig.model_validate({**config, "store": f"dynamodb://{table}"})).store.unit_ttl_days == 30
    with pytest.raises(ValueError, match="only unit_ttl_days is known"):
        compose(LakeConfig.model_validate({**config, "store": f"dynamodb://{table}?ttl=3"})).store  # noqa: B018
