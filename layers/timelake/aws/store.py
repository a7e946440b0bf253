"""The job store on DynamoDB: the same contract as `timelake.store.SqliteJobStore`, for Lambdas.

One table (`table_definition()`, mirrored by the CDK stack), string keys ``pk``/``sk``:

================  ===================  ===================================================
pk                sk                   attributes
================  ===================  ===================================================
``JOB#<job_id>``  ``JOB``              job_id, tbl, phase, spec, state and phase_log (JSON
                                       strings), created_at, updated_at, version; ``gsi1pk="JOBS"``,
                                       ``gsi1sk="<created_at, zero-padded>#<job_id>"``
``JOB#<job_id>``  ``UNIT#<unit_id>``   unit_id, status, info and result (JSON strings);
                                       ``expires_at`` (epoch seconds, the table's TTL) once the
                                       job is finished
``LEASES``        ``LEASES``           leases (JSON: job_id → [table, start, end]), version
``JOB#<job_id>``  ``RATE``             empty_at (the source rate budget, see `timelake.throttle`),
                                       rows_per_second (a rate set on the running job), version
``JOB#<job_id>``  ``PROGRESS#<item>``  counts (JSON): how far a scan task or a step has got;
                                       ``expires_at`` once the job is finished
================  ===================  ===================================================

Why this shape:

- A job's units share its partition, so ``units()`` is one paginated, strongly consistent query,
  returned in ``unit_id`` order because DynamoDB sorts ``sk`` by UTF-8 bytes, as SQLite does.
- ``list_jobs`` reads GSI ``gsi1`` (one key for all jobs, sorted by creation time, projection ALL)
  and filters by table: backfill jobs number in the hundreds, not millions. GSIs are eventually
  consistent, so a job created a moment ago may be missing from the list; everything that drives
  a job (get_job, units, leases) reads the base table with ConsistentRead.
- All leases live in ONE item. A job holds at most one lease (as in SQLite, where job_id is the
  key), and ``release_lease(job_id)`` / ``leases()`` do not know the table, so one item keeps each
  operation one consistent read plus one conditional write. Leases change twice per job (plan,
  publish/abort): far below a single item's write limit; at ~60 bytes per unpublished job the
  400 KB item limit is thousands of concurrent jobs away.
- The job and lease items are rewritten whole under a ``version`` condition (optimistic
  concurrency, re-read and retried on conflict): DynamoDB cannot merge into a JSON string, and
  the lease overlap check must see the same leases the write replaces.
- Progress counts live in their own items, one per scan task or step, each written by one worker:
  a hundred scan Lambdas noting their rows every second would otherwise all rewrite the job item.
- A finished job's unit items expire (``expires_at``, `TTL_ATTRIBUTE`, ``unit_ttl_days`` after the
  job reached a `TERMINAL` phase): they are one item per unit, thousands per job, and nothing reads
  them once the job is over (its report lives in the job item, which stays). A failed job is not
  finished (resume needs its units), so its units never expire.
- ``state`` grows with checks and per-partition sums; keeping it a JSON string keeps types exact,
  but the whole job item must stay under DynamoDB's 400 KB item limit: spill bulky results to the
  staging area and keep references in the state.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext, suppress
from typing import Any, Unpack

import boto3
from botocore.config import Config

from timelake.ports.store import (
    RATE_BURST_SECONDS, TERMINAL, Guard, JobRecord, JobState, Lease, Phase, UnitRecord, accept, apply_update, job_exists,
    job_not_found, lease_conflict, reserve, unit_not_found,
)

Item = dict[str, dict[str, Any]]

_LEASES: Item = {"pk": {"S": "LEASES"}, "sk": {"S": "LEASES"}}
_WORKERS = 16
_BATCH = 25  # items per BatchWriteItem, DynamoDB's limit
_ATTEMPTS = 50
TTL_ATTRIBUTE = "expires_at"  # the table's TimeToLiveSpecification (set by the CDK stack)
DEFAULT_UNIT_TTL_DAYS = 30


def table_definition() -> dict[str, Any]:
    """Arguments for ``CreateTable`` besides ``TableName``: the single source of the table's shape,
    used by the tests to create it in moto and mirrored by the CDK stack."""
    return {
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": "S"} for name in ("pk", "sk", "gsi1pk", "gsi1sk")
        ],
        "GlobalSecondaryIndexes": [{
            "IndexName": "gsi1",
            "KeySchema": [
                {"AttributeName": "gsi1pk", "KeyType": "HASH"}, {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        }],
        "BillingMode": "PAY_PER_REQUEST",
    }


class DynamoJobStore:
    """Job state in a DynamoDB table, shared by every Lambda and writer of a deployment."""

    def __init__(self, table_name: str, client: Any = None, unit_ttl_days: int = DEFAULT_UNIT_TTL_DAYS) -> None:
        self.table_name = table_name
        self.unit_ttl_days = unit_ttl_days
        self._client = client or boto3.client(
            "dynamodb", config=Config(max_pool_connections=_WORKERS, retries={"mode": "standard"})
        )
        self._conditional_failed = self._client.exceptions.ConditionalCheckFailedException

    def create_job(self, job: JobRecord) -> None:
        def change(item: Item | None) -> Item:
            if item is not None:
                raise job_exists(job.job_id)
            now = time.time()
            return _job_item(JobRecord(job.job_id, job.table, job.phase, job.spec, job.state, now, now,
                                       [[job.phase, round(now, 3)]]))

        self._swap(_job_key(job.job_id), change)

    def get_job(self, job_id: str) -> JobRecord:
        item = self._get(_job_key(job_id))
        if item is None:
            raise job_not_found(job_id)
        return _job(item)

    def update_job(self, job_id: str, phase: Phase | None = None, **state: Unpack[JobState]) -> JobRecord:
        return self.update_job_if(job_id, accept, phase, **state)

    def update_job_if(self, job_id: str, guard: Guard, phase: Phase | None = None, **state: Unpack[JobState]) -> JobRecord:
        """The guard looks at the item as read; the write is conditional on its version, so a lost race
        re-reads and asks the guard again."""
        finishing: list[bool] = []

        def change(item: Item | None) -> Item:
            if item is None:
                raise job_not_found(job_id)
            job = _job(item)
            guard(job)
            finishing[:] = [job.phase not in TERMINAL and (phase or job.phase) in TERMINAL]
            apply_update(job, phase, state, time.time())
            return _job_item(job)

        job = _job(self._swap(_job_key(job_id), change))
        if finishing[0]:
            self._expire_units(job_id, job.updated_at + self.unit_ttl_days * 86_400, job.phase)
        return job

    def list_jobs(self, table: str | None = None) -> list[JobRecord]:
        query: dict[str, Any] = {
            "IndexName": "gsi1", "KeyConditionExpression": "gsi1pk = :jobs",
            "ExpressionAttributeValues": {":jobs": {"S": "JOBS"}},
        }
        if table:
            query["FilterExpression"] = "tbl = :tbl"
            query["ExpressionAttributeValues"][":tbl"] = {"S": table}
        return [_job(item) for item in self._query(**query)]

    def put_units(self, job_id: str, units: list[UnitRecord]) -> None:
        """One conditional put per unit (``attribute_not_exists``), many in parallel, so re-planning
        never resets a unit already written. BatchWriteItem cannot carry conditions, and in a
        TransactWriteItems one existing unit cancels all 100, so a re-plan would pay every chunk
        twice at double the write cost. At ~5 ms a put, 16 in flight write 10,000 units in ~3 s."""
        items = [_unit_key(job_id, u.unit_id) | {
            "unit_id": {"S": u.unit_id}, "status": {"S": u.status},
            "info": {"S": json.dumps(u.info)}, "result": {"S": json.dumps(u.result)},
        } for u in units]
        with ThreadPoolExecutor(_WORKERS) as pool:
            list(pool.map(self._insert_new, items))

    def units(self, job_id: str) -> list[UnitRecord]:
        return [_unit(item) for item in self._query(
            KeyConditionExpression="pk = :pk AND begins_with(sk, :unit)", ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": f"JOB#{job_id}"}, ":unit": {"S": "UNIT#"}},
        )]

    def _expire_units(self, job_id: str, at: float, phase: Phase) -> None:
        """Marks every unit (and progress note) of a finished job for DynamoDB's TTL deletion (DynamoDB
        deletes expired items for free). The items are rewritten whole as read, 25 to a BatchWriteItem (a
        10,000-unit job: 400 requests rather than 10,000, the same write units), since nothing else writes
        them once the job is finished. Except after an abort: a write Lambda still running may complete
        its unit meanwhile, which rewriting the item as read would undo, so there each gets its own UpdateItem."""
        expires = {"N": str(int(at))}

        def query(prefix: str, **more: Any) -> Iterator[Item]:
            return self._query(KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                               ExpressionAttributeValues={":pk": {"S": f"JOB#{job_id}"}, ":prefix": {"S": prefix}}, **more)

        if phase == Phase.ABORTED:
            def expire(key: Item) -> None:
                self._client.update_item(TableName=self.table_name, Key=key, UpdateExpression="SET #ttl = :at",
                                         ExpressionAttributeNames={"#ttl": TTL_ATTRIBUTE}, ExpressionAttributeValues={":at": expires})

            keys = [{"pk": item["pk"], "sk": item["sk"]} for prefix in ("UNIT#", "PROGRESS#")
                    for item in query(prefix, ProjectionExpression="pk, sk")]
            with ThreadPoolExecutor(_WORKERS) as pool:
                list(pool.map(expire, keys))
            return
        items = [item | {TTL_ATTRIBUTE: expires} for prefix in ("UNIT#", "PROGRESS#") for item in query(prefix, ConsistentRead=True)]
        with ThreadPoolExecutor(_WORKERS) as pool:
            list(pool.map(self._put_batch, [items[i:i + _BATCH] for i in range(0, len(items), _BATCH)]))

    def _put_batch(self, items: list[Item]) -> None:
        requests = [{"PutRequest": {"Item": item}} for item in items]
        for attempt in range(_ATTEMPTS):
            requests = self._client.batch_write_item(RequestItems={self.table_name: requests})["UnprocessedItems"].get(self.table_name)
            if not requests:
                return
            _backoff(attempt)
        raise RuntimeError(f"{self.table_name}: {len(requests)} item(s) still unprocessed after {_ATTEMPTS} attempts")

    def unit(self, job_id: str, unit_id: str) -> UnitRecord:
        item = self._get(_unit_key(job_id, unit_id))
        if item is None:
            raise unit_not_found(job_id, unit_id)
        return _unit(item)

    def job_and_unit(self, job_id: str, unit_id: str) -> tuple[JobRecord, UnitRecord]:
        """One strongly consistent BatchGetItem for both items (they share the job's partition)."""
        keys, found = [_job_key(job_id), _unit_key(job_id, unit_id)], []
        for attempt in range(_ATTEMPTS):
            answer = self._client.batch_get_item(RequestItems={self.table_name: {"Keys": keys, "ConsistentRead": True}})
            found += answer["Responses"].get(self.table_name, [])
            keys = answer["UnprocessedKeys"].get(self.table_name, {}).get("Keys")
            if not keys:
                break
            _backoff(attempt)
        items = {item["sk"]["S"]: item for item in found}
        if "JOB" not in items:
            raise job_not_found(job_id)
        if f"UNIT#{unit_id}" not in items:
            raise unit_not_found(job_id, unit_id)
        return _job(items["JOB"]), _unit(items[f"UNIT#{unit_id}"])

    def complete_unit(self, job_id: str, unit_id: str, result: dict[str, Any]) -> bool:
        try:
            self._client.update_item(
                TableName=self.table_name, Key=_unit_key(job_id, unit_id),
                UpdateExpression="SET #status = :done, #result = :result",
                ConditionExpression="attribute_exists(pk) AND #status <> :done",
                ExpressionAttributeNames={"#status": "status", "#result": "result"},
                ExpressionAttributeValues={":done": {"S": "done"}, ":result": {"S": json.dumps(result)}},
            )
        except self._conditional_failed:
            return False
        return True

    def reopen_units(self, job_id: str, unit_ids: list[str]) -> None:
        def reopen(unit_id: str) -> None:
            self._client.update_item(
                TableName=self.table_name, Key=_unit_key(job_id, unit_id),
                UpdateExpression="SET #status = :pending, #result = :empty", ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames={"#status": "status", "#result": "result"},
                ExpressionAttributeValues={":pending": {"S": "pending"}, ":empty": {"S": "{}"}},
            )

        with ThreadPoolExecutor(_WORKERS) as pool:
            list(pool.map(reopen, unit_ids))

    def acquire_lease(self, lease: Lease) -> None:
        def change(item: Item | None) -> Item:
            held = _held(item)
            for job_id, (table, start, end) in held.items():
                if job_id != lease.job_id and table == lease.table and start < lease.end and end > lease.start:
                    raise lease_conflict(lease, job_id)
            held.pop(lease.job_id, None)
            return _leases_item(held | {lease.job_id: [lease.table, lease.start, lease.end]})

        self._swap(_LEASES, change)

    def release_lease(self, job_id: str) -> None:
        self._swap(_LEASES, lambda item: _leases_item({j: r for j, r in _held(item).items() if j != job_id}))

    def leases(self, table: str | None = None) -> list[Lease]:
        held = _held(self._get(_LEASES))
        return [Lease(t, start, end, job_id) for job_id, (t, start, end) in held.items() if not table or t == table]

    def reserve_rows(self, job_id: str, rows: int, rows_per_second: float, now: float | None = None) -> float:
        clock = time.time if now is None else lambda: now
        unlimited = _Unlimited()

        def change(item: Item | None) -> Item:
            held = float(item["empty_at"]["N"]) if item and "empty_at" in item else None
            rate = float(item["rows_per_second"]["N"]) if item and "rows_per_second" in item else None
            empty_at = reserve(held, clock(), rows, rows_per_second, rate)
            if empty_at is None:
                raise unlimited
            return _kept_rate(item) | {"empty_at": {"N": repr(empty_at)}}

        try:
            return float(self._swap(_rate_key(job_id), change)["empty_at"]["N"]) - clock() - RATE_BURST_SECONDS
        except _Unlimited:
            return 0.0

    def set_rate(self, job_id: str, rows_per_second: int) -> None:
        def change(item: Item | None) -> Item:
            held = {"empty_at": item["empty_at"]} if item and "empty_at" in item else {}
            return held | {"rows_per_second": {"N": str(rows_per_second)}}

        self._swap(_rate_key(job_id), change)

    def note_progress(self, job_id: str, item: str, counts: dict[str, Any]) -> None:
        self._client.put_item(TableName=self.table_name, Item=_progress_key(job_id, item) | {
            "counts": {"S": json.dumps(counts)}})

    def progress_notes(self, job_id: str) -> dict[str, dict[str, Any]]:
        return {item["sk"]["S"].removeprefix("PROGRESS#"): json.loads(item["counts"]["S"]) for item in self._query(
            KeyConditionExpression="pk = :pk AND begins_with(sk, :progress)", ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": f"JOB#{job_id}"}, ":progress": {"S": "PROGRESS#"}})}

    def hold(self, job_id: str) -> AbstractContextManager[None]:
        """Nothing to hold: on AWS only the workflow's execution runs a job, and Step Functions
        refuses a second execution of the same name."""
        return nullcontext()

    def running(self, job_id: str) -> None:
        return None

    def _get(self, key: Item) -> Item | None:
        return self._client.get_item(TableName=self.table_name, Key=key, ConsistentRead=True).get("Item")

    def _query(self, **query: Any) -> Iterator[Item]:
        for page in self._client.get_paginator("query").paginate(TableName=self.table_name, **query):
            yield from page["Items"]

    def _swap(self, key: Item, change: Callable[[Item | None], Item]) -> Item:
        """Read-modify-write with optimistic concurrency: the write succeeds only if the item's version
        is still the one read; a lost race re-reads and re-applies ``change`` (which may then refuse)."""
        for attempt in range(_ATTEMPTS):
            item = self._get(key)
            version = int(item["version"]["N"]) if item else 0
            new = change(item) | key | {"version": {"N": str(version + 1)}}
            unchanged = {
                "ConditionExpression": "#v = :v", "ExpressionAttributeNames": {"#v": "version"},
                "ExpressionAttributeValues": {":v": item["version"]},
            } if item else {"ConditionExpression": "attribute_not_exists(pk)"}
            try:
                self._client.put_item(TableName=self.table_name, Item=new, **unchanged)
                return new
            except self._conditional_failed:
                _backoff(attempt)
        raise RuntimeError(f"{self.table_name} {key['pk']['S']}: still conflicting after {_ATTEMPTS} attempts")

    def _insert_new(self, item: Item) -> None:
        with suppress(self._conditional_failed):
            self._client.put_item(TableName=self.table_name, Item=item, ConditionExpression="attribute_not_exists(pk)")


class _Unlimited(Exception):
    """A reservation under no rate limit: nothing to write."""


def _kept_rate(item: Item | None) -> Item:
    return {"rows_per_second": item["rows_per_second"]} if item and "rows_per_second" in item else {}


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, 0.005 * 2 ** min(attempt, 7)))


def _job_key(job_id: str) -> Item:
    return {"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}}


def _rate_key(job_id: str) -> Item:
    return {"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "RATE"}}


def _progress_key(job_id: str, item: str) -> Item:
    return {"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": f"PROGRESS#{item}"}}


def _unit_key(job_id: str, unit_id: str) -> Item:
    return {"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": f"UNIT#{unit_id}"}}


def _job_item(job: JobRecord) -> Item:
    return _job_key(job.job_id) | {
        "job_id": {"S": job.job_id}, "tbl": {"S": job.table}, "phase": {"S": job.phase},
        "spec": {"S": json.dumps(job.spec)}, "state": {"S": json.dumps(job.state)},
        "created_at": {"N": repr(job.created_at)}, "updated_at": {"N": repr(job.updated_at)},
        "phase_log": {"S": json.dumps(job.phase_log)}, "gsi1pk": {"S": "JOBS"}, "gsi1sk": {"S": f"{job.created_at:020.6f}#{job.job_id}"},
    }


def _job(item: Item) -> JobRecord:
    return JobRecord(
        item["job_id"]["S"], item["tbl"]["S"], Phase(item["phase"]["S"]), json.loads(item["spec"]["S"]),
        json.loads(item["state"]["S"]), float(item["created_at"]["N"]), float(item["updated_at"]["N"]),
        json.loads(item["phase_log"]["S"]) if "phase_log" in item else [],
    )


def _unit(item: Item) -> UnitRecord:
    return UnitRecord(
        item["unit_id"]["S"], json.loads(item["info"]["S"]), item["status"]["S"], json.loads(item["result"]["S"])
    )


def _held(item: Item | None) -> dict[str, list[Any]]:
    return json.loads(item["leases"]["S"]) if item else {}


def _leases_item(held: dict[str, list[Any]]) -> Item:
    return {"leases": {"S": json.dumps(held)}}
