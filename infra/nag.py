"""The AWS Solutions findings this stack accepts, each on the narrowest construct, with the reason.

cdk-nag 3 names a finding ``AwsSolutions::<rule>[<finding>]``, the finding spelling out the
resource with logical ids (``<Data666C94C7.Arn>/*``); `_ref` builds those from the constructs,
so renaming a construct keeps its acknowledgment.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

from .stack import DIFF, FACTS, FUNCTIONS, RECORD_DATA, STAGING_PREFIX, TABLE_DATA, TABLE_METADATA, BackfillStack

RUNTIME = ("the engine layer is built from CPython 3.12 (cp312) aarch64 wheels and handlers must run on the interpreter "
           "the layer was built for; moving up is the runtime constant plus a layer rebuild, done together")
XRAY = ("X-Ray tracing (Tracing.ACTIVE): xray:PutTraceSegments and xray:PutTelemetryRecords have no resource-level "
        "permissions, so AWS requires Resource '*'")
LAKE_OBJECTS = ("lake files live at run-time paths (warehouse/<db>.db/<table>/data/<partition>/<unit>.parquet, "
                f"{STAGING_PREFIX}<job>/...): tables are created after deployment and units are cut per job, so keys "
                "cannot be listed; access stays inside this one bucket")
LAKE_PREFIX = {
    f"{STAGING_PREFIX}*": f"job scratch files (manifests, spills, failure notes) under {STAGING_PREFIX}<job>/, named by the job "
                          "id at run time; only steps that write or clear scratch get it",
    FACTS: f"validation's own files under {STAGING_PREFIX}<job>/validate/ (the check items, one staged file's facts), named "
           "by the job id and the file at run time; only the validate functions get it, and no other staging file",
    DIFF: f"the diff's own files under {STAGING_PREFIX}<job>/diff/ (the job's diff, combined from its tasks' and units' "
          "cells), named by the job id at run time; only the stage function, which combines it, gets it, and no other "
          "staging file",
    TABLE_DATA: "new data files under a table's data/ folder (warehouse/<db>.db/<table>/data/...), named per unit at run "
                "time; never the metadata/ folder; only the writers (write, rollup) put and only abort and rollup delete",
    TABLE_METADATA: "Iceberg metadata files of a commit (warehouse/<db>.db/<table>/metadata/...); only the steps that "
                    "commit (glue:UpdateTable) get it",
    **{prefix: "data files of the record tables a publish appends to (provenance, a table's __coverage companion), "
               "named at commit time; only publish and abort, which record what they did, get it" for prefix in RECORD_DATA},
}
GLUE_TABLES = ("the engine loads and commits whichever table of the configured Glue databases (glueDatabases) a job names; "
               "tables are created after deployment, so the grant covers those databases' tables and no other database")

S3_TABLES = ("the engine loads and commits whichever table of the table bucket a job names (catalog=s3tables); tables "
             "are created after deployment, so the grant covers that bucket's tables and no other bucket")


def acknowledge(stack: BackfillStack) -> None:
    for name, fn in stack.functions.items():
        _ack(fn, "AwsSolutions-L1", RUNTIME)
        _ack(fn.role, "AwsSolutions-IAM5[Resource::*]", XRAY)
        if FUNCTIONS[name].engine:
            bucket = _ref(stack, stack.bucket, "Arn")
            _ack(fn.role, f"AwsSolutions-IAM5[Resource::{bucket}/*]", LAKE_OBJECTS)
            for prefix, reason in LAKE_PREFIX.items():
                _ack(fn.role, f"AwsSolutions-IAM5[Resource::{bucket}/{prefix}]", reason)
            for db in stack.settings.all_databases:
                _ack(fn.role, f"AwsSolutions-IAM5[Resource::{_glue(db)}]", GLUE_TABLES)
            if stack.table_bucket_arn is not None:
                arn = _ref(stack, stack.table_bucket, "TableBucketARN") if stack.table_bucket else stack.table_bucket_arn
                _ack(fn.role, f"AwsSolutions-IAM5[Resource::{arn}/table/*]", S3_TABLES)
        if FUNCTIONS[name].reads_sources:
            for source in stack.settings.source_buckets:
                _ack(fn.role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{source}/*]",
                     f"read-only access to source files in '{source}', a bucket (and prefix) the deployer named "
                     "(sourceBuckets) for exports whose keys a job names at run time")

    machine = stack.state_machine
    workflow = _ref(stack, machine, "Name")
    states = "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>"
    map_policy = stack.node.find_child("WorkflowDistributedMapPolicy")
    _ack(machine.role, "AwsSolutions-IAM5[Resource::*]",
         "X-Ray tracing and vended log delivery (logs:CreateLogDelivery, logs:PutResourcePolicy, ...) have no "
         "resource-level permissions, so AWS requires Resource '*' for a state machine that logs and traces")
    _ack(map_policy, f"AwsSolutions-IAM5[Resource::{states}:execution:{workflow}:*]",
         "the Distributed Map describes, stops and redrives the executions of this state machine only; their names "
         "(job ids) exist at run time only")
    _ack(map_policy, f"AwsSolutions-IAM5[Resource::{states}:execution:{workflow}/*]",
         "Distributed Map child executions are named <state machine>/<map run>:<id> at run time; this covers the "
         "children of this state machine only")
    _ack(map_policy, f"AwsSolutions-IAM5[Resource::{states}:mapRun:{workflow}/*]",
         "map runs get ids at run time; DescribeMapRun/UpdateMapRun are limited to this state machine's map runs")
    _ack(map_policy, f"AwsSolutions-IAM5[Resource::{_ref(stack, stack.bucket, 'Arn')}/{STAGING_PREFIX}*]",
         "the Maps' ItemReaders read the piece and unit lists that plan and cut write under the job's staging "
         "folder, named by the job id at run time; read-only and limited to the staging prefix")
    _ack(stack.functions["api"].role, f"AwsSolutions-IAM5[Resource::{states}:execution:{workflow}:*]",
         "the API describes and redrives a job's execution by its name (the job id, chosen at run time), and lists "
         "its map runs to apply a settings change; limited to this state machine's executions")
    _ack(stack.functions["api"].role, f"AwsSolutions-IAM5[Resource::{states}:mapRun:{workflow}/*]",
         "a settings change updates the MaxConcurrency of the job's running map runs, whose ids exist at run time "
         "only; UpdateMapRun alone, limited to this state machine's map runs")

    _ack(stack.node.find_child("RollupDeadLetters"), "AwsSolutions-SQS3",
         "this queue IS the dead-letter queue of the rollup rule's Lambda target (EventBridge, not SQS, sends to it, so "
         "SQS does not see it as a redrive target); a dead-letter queue of a dead-letter queue would only hide events")

    _ack(stack.node.find_child("RollupFailures"), "AwsSolutions-SQS3",
         "this queue IS the on-failure destination of the rollup Lambda (Lambda, not SQS, sends to it after the "
         "asynchronous retries); it is a dead-letter store with its own depth alarm, and a queue behind it would only hide failures")
    api = stack.api
    _ack(api.node.find_child("CloudWatchRole"),
         "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]",
         "API Gateway's account-level logging role, needed for the access logs; the AWS managed policy is the one AWS "
         "documents for it and only allows writing to CloudWatch Logs")
    _ack(api.root, "AwsSolutions-COG4",
         "every method uses IAM (SigV4) authorization: callers are operators and services with AWS credentials "
         "(CLI --on aws, pipelines), there is no end-user sign-in for a Cognito user pool to serve")
    _ack(api.deployment_stage, "AwsSolutions-APIG3",
         "no WAF web ACL: API Gateway rejects unsigned requests before any integration runs, and the only callers "
         "are IAM principals of this account; a web ACL would add cost without a rule that applies to them")


def _ack(scope: IConstruct, rule: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=f"AwsSolutions::{rule}", reason=reason))


def _ref(stack: Stack, construct: IConstruct, attribute: str) -> str:
    """How cdk-nag prints ``Fn::GetAtt`` of ``construct``: ``<LogicalId.Attribute>``."""
    resource = construct.node.default_child or construct
    return f"<{stack.resolve(stack.get_logical_id(resource))}.{attribute}>"


def _glue(database: str) -> str:
    return f"arn:<AWS::Partition>:glue:<AWS::Region>:<AWS::AccountId>:table/{database}/*"
