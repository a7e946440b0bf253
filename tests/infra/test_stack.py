"""The synthesized stack, resource by resource: what a deployment must have to run a backfill."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from infra.app import STACK_NAME, build_app, feature_flags
from infra.layer import LAYERS
from infra.stack import (ASL, DATABASE, EVENT_BUS, FUNCTIONS, FUNCTIONS_DIR, LAYER_DESCRIPTIONS, ROLLUP_CONCURRENCY,
                         WORKFLOW_FUNCTIONS, Settings, distributed_maps)
from timelake.aws.store import TTL_ATTRIBUTE, table_definition
from timelake.ports.runtime import LakeConfig

from .conftest import NO_BUNDLING, Synthesized

REFS = {"AWS::Region": "eu-central-1", "AWS::AccountId": "123456789012", "AWS::Partition": "aws"}


@pytest.fixture(scope="module")
def template(synthesized: Synthesized) -> Template:
    return Template.from_json(synthesized.template)


def render(value: Any, names: dict[str, str]) -> str:
    """A CloudFormation string expression as text, with ``Ref``s replaced from ``names``."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(render(part, names) for part in parts)
    if "Ref" in value:
        return names.get(value["Ref"], REFS.get(value["Ref"], f"<{value['Ref']}>"))
    return "<{}>".format(".".join(value["Fn::GetAtt"]))


def one(synthesized: Synthesized, kind: str, **match: Any) -> tuple[str, dict[str, Any]]:
    found = [(name, r) for name, r in synthesized.resources(kind).items()
             if all(r["Properties"].get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one {kind} with {match}, found {[n for n, _ in found]}"
    return found[0]


def functions(synthesized: Synthesized) -> dict[str, tuple[str, dict[str, Any]]]:
    """Function name (``plan``, ``api`` ...) → (logical id, properties)."""
    by_description = {r["Properties"]["Description"]: (name, r["Properties"])
                      for name, r in synthesized.resources("AWS::Lambda::Function").items()}
    return {name: by_description[f"timelake backfill: {name.replace('_', ' ')}"] for name in FUNCTIONS}


def statements(synthesized: Synthesized, role_logical_id: str) -> list[dict[str, Any]]:
    return [s for policy in synthesized.resources("AWS::IAM::Policy").values()
            if {"Ref": role_logical_id} in policy["Properties"].get("Roles", [])
            for s in policy["Properties"]["PolicyDocument"]["Statement"]]


def actions(statement: dict[str, Any]) -> set[str]:
    return set([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])


def data_bucket(synthesized: Synthesized) -> str:
    return next(name for name, r in synthesized.resources("AWS::S3::Bucket").items() if "LoggingConfiguration" in r["Properties"])


def test_bucket_is_private_encrypted_logged_and_expires_staging(synthesized: Synthesized) -> None:
    bucket = synthesized.template["Resources"][data_bucket(synthesized)]["Properties"]
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    rules = {rule["Id"]: rule for rule in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-staging"] == {"Id": "expire-staging", "Prefix": "_backfill/", "ExpirationInDays": 14, "Status": "Enabled"}
    assert rules["abort-incomplete-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    logs_bucket = bucket["LoggingConfiguration"]["DestinationBucketName"]["Ref"]
    assert synthesized.template["Resources"][logs_bucket]["Type"] == "AWS::S3::Bucket"


def test_every_bucket_denies_insecure_transport(template: Template, synthesized: Synthesized) -> None:
    for bucket in synthesized.resources("AWS::S3::Bucket"):
        template.has_resource_properties("AWS::S3::BucketPolicy", {
            "Bucket": {"Ref": bucket},
            "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
                "Effect": "Deny", "Action": "s3:*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])},
        })


def test_glue_database(template: Template) -> None:
    template.has_resource_properties("AWS::Glue::Database", {
        "CatalogId": {"Ref": "AWS::AccountId"}, "DatabaseInput": Match.object_like({"Name": DATABASE})})


def test_jobs_table_mirrors_the_store_definition(synthesized: Synthesized) -> None:
    """The deployed table and `timelake.aws.store.table_definition()` must never drift."""
    (_, table), = synthesized.resources("AWS::DynamoDB::Table").items()
    props, expected = table["Properties"], table_definition()

    def indexes(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {i["IndexName"]: {"KeySchema": i["KeySchema"], "Projection": i["Projection"]} for i in items}

    assert props["BillingMode"] == expected["BillingMode"] == "PAY_PER_REQUEST"
    assert props["KeySchema"] == expected["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(expected["AttributeDefinitions"], key=str)
    assert indexes(props.get("GlobalSecondaryIndexes", [])) == indexes(expected.get("GlobalSecondaryIndexes", []))
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert table["DeletionPolicy"] == "Retain"


def test_every_handler_directory_is_deployed() -> None:
    handlers = {d.name for d in FUNCTIONS_DIR.iterdir() if (d / "app.py").exists()}
    assert handlers == set(FUNCTIONS), f"functions/ has {sorted(handlers)}, the stack deploys {sorted(FUNCTIONS)}"


def test_functions_are_arm64_python312_traced_with_the_layer_and_log_retention(synthesized: Synthesized) -> None:
    names = {description: name for name, description in LAYER_DESCRIPTIONS.items()}
    layers = {names[r["Properties"]["Description"]]: logical for logical, r in synthesized.resources("AWS::Lambda::LayerVersion").items()}
    assert set(layers) == set(LAYERS)
    for name, (_, props) in functions(synthesized).items():
        spec = FUNCTIONS[name]
        assert props["Runtime"] == "python3.12" and props["Architectures"] == ["arm64"] and props["Handler"] == "app.handler", name
        # CDK orders layers by its own rule; they hold disjoint files, so the order does not matter
        assert sorted(ref["Ref"] for ref in props["Layers"]) == sorted(layers[layer] for layer in spec.layers()), name
        assert props["TracingConfig"] == {"Mode": "Active"}, name
        assert (props["MemorySize"], props["Timeout"]) == (spec.memory, int(spec.timeout.to_seconds())), name
        log_group = synthesized.template["Resources"][props["LoggingConfig"]["LogGroup"]["Ref"]]
        assert log_group["Properties"]["RetentionInDays"] == 90, name
    memory = {name: props["MemorySize"] for name, (_, props) in functions(synthesized).items()}
    assert memory == {"plan": 3008, "scan": 3008, "cut": 3008, "write": 3008, "stage": 2048, "validate": 2048, "validate_item": 1769,
                      "publish": 2048, "record_failure": 512, "canary": 2048, "abort": 1024, "api": 512, "rollup": 2048}
    for layer in layers.values():
        layer_props = synthesized.template["Resources"][layer]["Properties"]
        assert layer_props["CompatibleArchitectures"] == ["arm64"] and layer_props["CompatibleRuntimes"] == ["python3.12"]
    # only the functions that can reach DuckDB (SQL checks, rollups, DuckDB or line-protocol sources, dry run) carry it
    assert {name for name, spec in FUNCTIONS.items() if "duckdb" in spec.layers()} == {"plan", "scan", "validate", "canary", "rollup"}


def test_every_function_gets_a_lake_config_the_engine_parses(synthesized: Synthesized) -> None:
    names = {data_bucket(synthesized): "data-bucket", **{k: "jobs-table" for k in synthesized.resources("AWS::DynamoDB::Table")},
             **{k: EVENT_BUS for k in synthesized.resources("AWS::Events::EventBus")},
             **{k: "alarm-topic" for k in synthesized.resources("AWS::SNS::Topic") if k.startswith("AlarmTopic")}}
    for name, (_, props) in functions(synthesized).items():
        env = props["Environment"]["Variables"]
        config = LakeConfig.model_validate_json(render(env["TIMELAKE_CONFIG"], names))
        assert config.catalog_name == "glue"
        assert config.catalog_props == {"type": "glue", "warehouse": "s3://data-bucket/warehouse", "glue.id": "123456789012",
                                        "glue.region": "eu-central-1", "s3.region": "eu-central-1"}
        assert (config.store, config.staging, config.events, config.alarms) == (
            "dynamodb://jobs-table?unit_ttl_days=30", "s3://data-bucket/_backfill", f"eventbridge://{EVENT_BUS}", "sns://alarm-topic")
        assert {k: v for k, v in env.items() if k.startswith("POWERTOOLS_")} == {
            "POWERTOOLS_SERVICE_NAME": "timelake-backfill", "POWERTOOLS_METRICS_NAMESPACE": "Timelake", "POWERTOOLS_LOG_LEVEL": "INFO"}
        assert ("STATE_MACHINE_ARN" in env) == (name == "api"), name
    (machine, _), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    assert functions(synthesized)["api"][1]["Environment"]["Variables"]["STATE_MACHINE_ARN"] == {"Ref": machine}


def test_state_machine_is_the_workflow_file_with_every_substitution(synthesized: Synthesized) -> None:
    (_, machine), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    props = machine["Properties"]
    assert props["StateMachineType"] == "STANDARD"
    assert json.loads(props["DefinitionString"]) == json.loads(ASL.read_text())
    placeholders = set(re.findall(r"\$\{(\w+)\}", ASL.read_text()))
    assert placeholders <= set(props["DefinitionSubstitutions"]), placeholders - set(props["DefinitionSubstitutions"])
    fns = functions(synthesized)
    for name in WORKFLOW_FUNCTIONS:
        key = "".join(p.capitalize() for p in name.split("_")) + "FunctionArn"
        assert props["DefinitionSubstitutions"][key] == {"Fn::GetAtt": [fns[name][0], "Arn"]}
    assert props["DefinitionSubstitutions"]["StagingBucket"] == {"Ref": data_bucket(synthesized)}


def test_state_machine_logs_everything_and_traces(synthesized: Synthesized) -> None:
    (_, machine), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    props = machine["Properties"]
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is True
    log_group = props["LoggingConfiguration"]["Destinations"][0]["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert synthesized.template["Resources"][log_group]["Type"] == "AWS::Logs::LogGroup"


def test_distributed_map_grants_live_in_a_separate_policy(synthesized: Synthesized) -> None:
    (machine, props), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    role = props["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    separate = [p["Properties"] for name, p in synthesized.resources("AWS::IAM::Policy").items()
                if name.startswith("WorkflowDistributedMapPolicy")]
    assert len(separate) == 1 and separate[0]["Roles"] == [{"Ref": role}]
    granted = {a: s["Resource"] for s in separate[0]["PolicyDocument"]["Statement"] for a in actions(s)}
    assert granted["states:StartExecution"] == {"Ref": machine}
    for action in ("states:DescribeExecution", "states:StopExecution", "states:RedriveExecution", "states:ListMapRuns",
                   "states:DescribeMapRun", "states:UpdateMapRun"):
        assert machine in json.dumps(granted[action]), action
    fns = functions(synthesized)
    assert sorted(granted["lambda:InvokeFunction"], key=str) == sorted(
        ({"Fn::GetAtt": [fns[name][0], "Arn"]} for name in WORKFLOW_FUNCTIONS), key=str)
    assert render(granted["s3:GetObject"], {}) == f"<{data_bucket(synthesized)}.Arn>/_backfill/*"


def test_each_function_role_grants_only_what_it_needs(synthesized: Synthesized) -> None:
    for name, (_, props) in functions(synthesized).items():
        role = props["Role"]["Fn::GetAtt"][0]
        assert "ManagedPolicyArns" not in synthesized.template["Resources"][role]["Properties"], name
        granted = set().union(*(actions(s) for s in statements(synthesized, role)))
        spec = FUNCTIONS[name]
        assert ("glue:UpdateTable" in granted) == spec.commits, name
        assert ("glue:CreateTable" in granted) == spec.commits, name  # the publish step creates <table>__coverage
        assert ("glue:GetTable" in granted) == spec.engine, name
        assert ("s3:PutObject" in granted) == (spec.scratch or spec.clears_scratch or spec.writes_facts or spec.writes_data
                                               or spec.commits), name
        assert ("s3:DeleteObject" in granted) == (spec.clears_scratch or spec.deletes_data), name
        assert ("lambda:InvokeFunction" in granted) == (name == "api"), name  # the API runs aborts in the abort Lambda
        assert ("events:PutEvents" in granted) == (name == "publish"), name
        assert {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"} <= granted, name
        states = {a for a in granted if a.startswith("states:")}
        expected = {"states:StartExecution", "states:DescribeExecution", "states:RedriveExecution", "states:ListExecutions",
                    "states:StopExecution", "states:SendTaskSuccess", "states:SendTaskFailure",
                    "states:ListMapRuns", "states:UpdateMapRun"}  # settings mid-job: the running Map's concurrency
        assert states == (expected if name == "api" else set()), name
        assert not {a for a in granted if a.endswith("*")}, name


def test_wildcard_resources_only_for_actions_without_resource_level_permissions(synthesized: Synthesized) -> None:
    no_resource_level = re.compile(r"^(xray:|logs:(CreateLogDelivery|DeleteLogDelivery|DescribeLogGroups|DescribeResourcePolicies"
                                   r"|GetLogDelivery|ListLogDeliveries|PutResourcePolicy|UpdateLogDelivery)$)")
    for name, policy in synthesized.resources("AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if "*" in (statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]):
                assert all(no_resource_level.match(a) for a in actions(statement)), (name, statement)


def test_event_bus(template: Template) -> None:
    template.has_resource_properties("AWS::Events::EventBus", {"Name": EVENT_BUS})


def test_api_routes_use_iam_auth_and_lambda_proxy(synthesized: Synthesized) -> None:
    resources = synthesized.resources("AWS::ApiGateway::Resource")

    def path(resource: str) -> str:
        props = resources[resource]["Properties"]
        parent = props["ParentId"]
        return f"{path(parent['Ref']) if 'Ref' in parent else ''}/{props['PathPart']}"  # else: the API's root

    api_fn = functions(synthesized)["api"][0]
    routes = set()
    for method in synthesized.resources("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        assert props["AuthorizationType"] == "AWS_IAM"
        assert props["Integration"]["Type"] == "AWS_PROXY" and api_fn in json.dumps(props["Integration"]["Uri"])
        assert "RequestValidatorId" in props
        routes.add((props["HttpMethod"], path(props["ResourceId"]["Ref"])))
    assert routes == {("POST", "/backfills"), ("GET", "/backfills"), ("GET", "/backfills/{id}"),
                      ("GET", "/backfills/{id}/report"), ("POST", "/backfills/{id}/resume"), ("POST", "/backfills/{id}/abort"),
                      ("POST", "/backfills/{id}/approve"), ("POST", "/backfills/{id}/reject"),
                      ("POST", "/backfills/{id}/settings"), ("GET", "/tables/{table}/coverage")}


def test_api_validates_the_job_body_and_logs_and_traces_its_stage(synthesized: Synthesized, template: Template) -> None:
    (model_id, model), = synthesized.resources("AWS::ApiGateway::Model").items()
    assert model["Properties"]["Schema"]["required"] == ["table", "source"]
    post = [m["Properties"] for m in synthesized.resources("AWS::ApiGateway::Method").values()
            if m["Properties"].get("RequestModels")]
    assert len(post) == 1 and post[0]["HttpMethod"] == "POST" and post[0]["RequestModels"] == {"application/json": {"Ref": model_id}}
    template.has_resource_properties("AWS::ApiGateway::RequestValidator", {"ValidateRequestBody": True, "ValidateRequestParameters": True})
    template.has_resource_properties("AWS::ApiGateway::Stage", {
        "TracingEnabled": True, "AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value()}),
        "MethodSettings": Match.array_with([Match.object_like({"LoggingLevel": "ERROR", "MetricsEnabled": True})])})


def test_dashboard_shows_executions_custom_metrics_and_lambda_health(synthesized: Synthesized) -> None:
    (_, dashboard), = synthesized.resources("AWS::CloudWatch::Dashboard").items()
    body = render(dashboard["Properties"]["DashboardBody"], {})
    for metric in ("ExecutionsStarted", "ExecutionsSucceeded", "ExecutionsFailed", "RowsWritten", "BytesWritten",
                   "UnitDuration", "Errors", "Throttles", "Duration", 'Namespace=\\"Timelake\\"'):
        assert metric in body, metric
    for name, (logical_id, _) in functions(synthesized).items():
        assert logical_id in body, name


def test_alarm_on_failed_executions(synthesized: Synthesized, template: Template) -> None:
    (machine, _), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "Namespace": "AWS/States", "MetricName": "ExecutionsFailed", "Threshold": 1, "Statistic": "Sum",
        "ComparisonOperator": "GreaterThanOrEqualToThreshold", "Dimensions": [{"Name": "StateMachineArn", "Value": {"Ref": machine}}]})


def test_outputs(synthesized: Synthesized) -> None:
    assert set(synthesized.template["Outputs"]) == {"BucketName", "JobsTableName", "StateMachineArn", "ApiUrl", "EventBusName", "GlueDatabase",
                                                       "LakeConfig", "AlarmTopicArn", "OperatorsTopicArn"}
    assert synthesized.template["Outputs"]["GlueDatabase"]["Value"] == DATABASE


def test_deploy_time_context_shapes_grants_and_concurrency() -> None:
    """``-c sourceBuckets=exports/plant-1 -c glueDatabases=plant -c writeConcurrency=50``: read-only access to that
    prefix for the functions that read sources, the database created and granted, the reserved concurrency set;
    each acknowledged for cdk-nag (synth raises otherwise)."""
    app, _ = build_app({**feature_flags(), **NO_BUNDLING, "sourceBuckets": "exports/plant-1", "glueDatabases": "plant",
                        "writeConcurrency": "50", "scanConcurrency": 20})
    synthesized = Synthesized(app.synth().get_stack_by_name(STACK_NAME).template, {}, Path())
    for name, (_, props) in functions(synthesized).items():
        role_statements = statements(synthesized, props["Role"]["Fn::GetAtt"][0])
        granted = [s for s in role_statements if "exports" in json.dumps(s["Resource"])]
        assert bool(granted) == FUNCTIONS[name].reads_sources, name
        assert all(actions(s) <= {"s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"} for s in granted), name
        assert all(render(r, {}).endswith(("exports/plant-1/*", ":::exports")) for s in granted
                   for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]) if "exports" in render(r, {})), name
        glue = json.dumps([s["Resource"] for s in role_statements if "glue:GetTable" in actions(s)])
        assert ("table/plant/*" in glue) == FUNCTIONS[name].engine and "table/iot/*" not in glue, name
        assert props.get("ReservedConcurrentExecutions") == {"write": 50, "scan": 20}.get(name), name
    names = {r["Properties"]["DatabaseInput"]["Name"] for r in synthesized.resources("AWS::Glue::Database").values()}
    assert names == {DATABASE, "plant"}


def test_defaults_run_the_readme_example(synthesized: Synthesized) -> None:
    """No context: the example's database (iot) and source bucket (old-historian) are granted."""
    example = json.loads((FUNCTIONS_DIR.parent / "examples" / "job.json").read_text())
    database, bucket = example["table"].split(".")[0], example["source"].removeprefix("s3://").split("/")[0]
    names = {r["Properties"]["DatabaseInput"]["Name"] for r in synthesized.resources("AWS::Glue::Database").values()}
    assert database in names
    for name, (_, props) in functions(synthesized).items():
        text = json.dumps(statements(synthesized, props["Role"]["Fn::GetAtt"][0]))
        assert (f"table/{database}/*" in text) == FUNCTIONS[name].engine, name
        assert (f":::{bucket}/*" in text) == FUNCTIONS[name].reads_sources, name
        assert props.get("ReservedConcurrentExecutions") == {"write": 200, "scan": 100}.get(name), name


@pytest.mark.parametrize(("key", "value", "message"), [
    ("writeConcurrency", "many", "context writeConcurrency must be a whole number, got 'many'"),
    ("scanConcurrency", "0", "context scanConcurrency must be at least 1, got 0"),
    ("glueDatabases", "Bad-Name", "context glueDatabases: 'Bad-Name' is not a Glue database name"),
    ("rollupWorkMaxAgeHours", "0", "context rollupWorkMaxAgeHours must be at least 1, got 0"),
])
def test_bad_context_is_refused_with_its_name(key: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings.from_context({key: value}.get)


def test_published_events_refresh_rollups_with_retries_and_a_dead_letter_queue(synthesized: Synthesized) -> None:
    (_, rule), = synthesized.resources("AWS::Events::Rule").items()
    props = rule["Properties"]
    assert props["EventPattern"] == {"source": ["timelake.backfill"], "detail-type": ["Backfill Published"]}
    (target,) = props["Targets"]
    assert functions(synthesized)["rollup"][0] in json.dumps(target["Arn"])
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 86400, "MaximumRetryAttempts": 8}
    dead_letters = [q for q in synthesized.resources("AWS::SQS::Queue") if q.startswith("RollupDeadLetters")]
    assert len(dead_letters) == 1 and json.dumps(target["DeadLetterConfig"]["Arn"]).count(dead_letters[0]) == 1


def test_the_alarm_topic_is_encrypted_and_no_backfill_role_may_publish_to_it(synthesized: Synthesized, template: Template) -> None:
    (topic, props), = ((k, v) for k, v in synthesized.resources("AWS::SNS::Topic").items() if k.startswith("AlarmTopic"))
    assert render(props["Properties"]["KmsMasterKeyId"], {}).endswith(":alias/aws/sns")
    policies = json.dumps(synthesized.resources("AWS::IAM::Policy"))
    assert "sns:Publish" not in policies and topic not in policies
    (topic_policy,) = (p for p in synthesized.resources("AWS::SNS::TopicPolicy").values() if p["Properties"]["Topics"] == [{"Ref": topic}])
    (deny,) = topic_policy["Properties"]["PolicyDocument"]["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def alarms(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in synthesized.resources("AWS::CloudWatch::Alarm").items()}


def test_every_alarm_tells_the_operators_through_a_topic_under_a_customer_managed_key(synthesized: Synthesized) -> None:
    """CloudWatch cannot publish to a topic under the AWS-managed alias/aws/sns key, so the operators'
    topic has its own key, whose policy lets CloudWatch (of this account only) use it."""
    (topic, props), = ((k, v["Properties"]) for k, v in synthesized.resources("AWS::SNS::Topic").items() if k.startswith("OperatorsTopic"))
    (key, key_props), = synthesized.resources("AWS::KMS::Key").items()
    assert props["KmsMasterKeyId"] == {"Fn::GetAtt": [key, "Arn"]} and key_props["Properties"]["EnableKeyRotation"] is True
    cloudwatch = [s for s in key_props["Properties"]["KeyPolicy"]["Statement"] if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert cloudwatch and set(cloudwatch[0]["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    assert "aws:SourceAccount" in json.dumps(cloudwatch[0]["Condition"])
    assert alarms(synthesized) and all(a["AlarmActions"] == [{"Ref": topic}] for a in alarms(synthesized).values())
    assert synthesized.template["Outputs"]["OperatorsTopicArn"]["Value"] == {"Ref": topic}
    assert not synthesized.resources("AWS::SNS::Subscription")  # no alarmEmail in the default context


def test_alarms_on_lambda_errors_and_throttles_per_function_and_on_both_rollup_queues(synthesized: Synthesized) -> None:
    found = {(a["Namespace"], a["MetricName"], json.dumps(a.get("Dimensions"))) for a in alarms(synthesized).values()}
    for name, (logical_id, _) in functions(synthesized).items():
        for metric in ("Errors", "Throttles"):
            assert ("AWS/Lambda", metric, json.dumps([{"Name": "FunctionName", "Value": {"Ref": logical_id}}])) in found, (name, metric)
    queues = synthesized.resources("AWS::SQS::Queue")
    assert {q.rstrip("0123456789ABCDEF") for q in queues} == {"RollupDeadLetters", "RollupFailures", "RollupWork"}
    for queue in (q for q in queues if not q.startswith("RollupWork")):  # the work queue holds work, not failures
        assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible",
                json.dumps([{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}])) in found, queue
    assert ("AWS/States", "ExecutionsFailed") in {f[:2] for f in found}
    events = {k: a for k, a in alarms(synthesized).items() if a["MetricName"] != "ApproximateAgeOfOldestMessage"}
    assert len(events) == len(alarms(synthesized)) - 1  # the work queue's age alarm is the one that is not an event count
    assert all(a["Threshold"] == 1 and a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" for a in events.values())


def test_an_alarm_tells_the_operators_when_follow_up_work_waits_too_long(synthesized: Synthesized) -> None:
    """A piece on RollupWork for 12 h (``rollupWorkMaxAgeHours``): longer than a headline year's follow-up
    takes to drain 4 at once, so only a consumer that stopped, or a backlog it cannot keep up with, pages."""
    (work,) = (q for q in synthesized.resources("AWS::SQS::Queue") if q.startswith("RollupWork"))
    (topic,) = (k for k in synthesized.resources("AWS::SNS::Topic") if k.startswith("OperatorsTopic"))
    (age,) = (a for a in alarms(synthesized).values() if a["MetricName"] == "ApproximateAgeOfOldestMessage")
    assert (age["Namespace"], age["Dimensions"]) == ("AWS/SQS", [{"Name": "QueueName", "Value": {"Fn::GetAtt": [work, "QueueName"]}}])
    assert (age["Statistic"], age["Period"], age["EvaluationPeriods"]) == ("Maximum", 300, 1)
    assert (age["Threshold"], age["ComparisonOperator"]) == (12 * 3600, "GreaterThanOrEqualToThreshold")
    assert age["AlarmActions"] == [{"Ref": topic}] and age["TreatMissingData"] == "notBreaching"


def test_the_rollup_lambda_sends_what_still_fails_after_two_retries_to_a_queue(synthesized: Synthesized) -> None:
    (config,) = synthesized.resources("AWS::Lambda::EventInvokeConfig").values()
    props = config["Properties"]
    failures = next(q for q in synthesized.resources("AWS::SQS::Queue") if q.startswith("RollupFailures"))
    assert props["FunctionName"] == {"Ref": functions(synthesized)["rollup"][0]} and props["MaximumRetryAttempts"] == 2
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": [failures, "Arn"]}
    role = functions(synthesized)["rollup"][1]["Role"]["Fn::GetAtt"][0]
    assert any("sqs:SendMessage" in json.dumps(s["Action"]) and failures in json.dumps(s["Resource"]) for s in statements(synthesized, role))


def test_finished_jobs_units_expire_and_the_jobs_table_cannot_be_deleted(synthesized: Synthesized) -> None:
    (table,) = synthesized.resources("AWS::DynamoDB::Table").values()
    assert table["Properties"]["TimeToLiveSpecification"] == {"AttributeName": TTL_ATTRIBUTE, "Enabled": True}
    assert table["Properties"]["DeletionProtectionEnabled"] is True


def test_alarm_context_subscribes_an_email_or_uses_an_existing_topic() -> None:
    app, _ = build_app({**feature_flags(), **NO_BUNDLING, "alarmEmail": "ops@example.com", "unitTtlDays": "7", "rollupWorkMaxAgeHours": "2"})
    with_email = Synthesized(app.synth().get_stack_by_name(STACK_NAME).template, {}, Path())
    assert [a["Threshold"] for a in alarms(with_email).values() if a["MetricName"] == "ApproximateAgeOfOldestMessage"] == [7200]
    (subscription,) = with_email.resources("AWS::SNS::Subscription").values()
    assert (subscription["Properties"]["Protocol"], subscription["Properties"]["Endpoint"]) == ("email", "ops@example.com")
    env = next(iter(functions(with_email).values()))[1]["Environment"]["Variables"]
    assert "?unit_ttl_days=7" in json.dumps(env["TIMELAKE_CONFIG"])
    arn = "arn:aws:sns:eu-central-1:123456789012:platform-oncall"
    app, _ = build_app({**feature_flags(), **NO_BUNDLING, "alarmTopicArn": arn})
    existing = Synthesized(app.synth().get_stack_by_name(STACK_NAME).template, {}, Path())
    assert not existing.resources("AWS::KMS::Key") and [k for k in existing.resources("AWS::SNS::Topic")] == [
        k for k in existing.resources("AWS::SNS::Topic") if k.startswith("AlarmTopic")]
    assert alarms(existing) and all(a["AlarmActions"] == [arn] for a in alarms(existing).values())


MAPS = {"ScanSource": "scan", "WriteUnits": "write", "CheckFiles": "validate_item"}  # each Distributed Map's label and item function


def dashboard_metrics(synthesized: Synthesized) -> set[tuple[str, ...]]:
    """(namespace, metric, dimension, value) of every metric the dashboard plots; the state machine
    renders as ``MACHINE``, a function as its logical id in brackets, a queue as ``<logical.QueueName>``."""
    (machine, _), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    (dashboard,) = synthesized.resources("AWS::CloudWatch::Dashboard").values()
    body = json.loads(render(dashboard["Properties"]["DashboardBody"], {machine: "MACHINE"}))
    return {tuple(m[:4]) for w in body["widgets"] for m in w["properties"].get("metrics", []) if isinstance(m[0], str) and len(m) > 3}


def test_the_dashboard_shows_map_run_progress(synthesized: Synthesized) -> None:
    (dashboard,) = synthesized.resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "Map-run progress" in body and "RUNNING_SUM(write_ok - write_err)" in body and "RUNNING_SUM(scan_ok - scan_err)" in body
    assert "ConcurrentExecutions" in body


def test_the_dashboard_follows_each_distributed_map_by_its_child_executions_and_item_lambda(synthesized: Synthesized) -> None:
    """All three Maps of the workflow: their child executions report under ``<state machine ARN>/<Label>``
    (started, done, failed, timed out, aborted), and their item Lambda's invocations, errors and concurrency."""
    definition = json.loads(ASL.read_text())
    labels = {s["Label"] for s in definition["States"].values()
              if s["Type"] == "Map" and s["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"}
    assert labels == set(MAPS) and distributed_maps() == MAPS
    (dashboard,) = synthesized.resources("AWS::CloudWatch::Dashboard").values()
    body, plotted, fns = json.dumps(dashboard["Properties"]["DashboardBody"]), dashboard_metrics(synthesized), functions(synthesized)
    for label, name in MAPS.items():
        for metric in ("ExecutionsStarted", "ExecutionsSucceeded", "ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"):
            assert ("AWS/States", metric, "StateMachineArn", f"MACHINE/{label}") in plotted, (label, metric)
        assert f"RUNNING_SUM({label.lower()}_done)" in body and f"Map-run progress: {label} ({name} Lambda" in body, label
        for metric in ("Invocations", "Errors", "ConcurrentExecutions"):
            assert ("AWS/Lambda", metric, "FunctionName", f"<{fns[name][0]}>") in plotted, (name, metric)
        assert f"RUNNING_SUM({name}_ok - {name}_err)" in body, name


def test_the_dashboard_shows_the_follow_up_queues_and_the_age_alarm(synthesized: Synthesized) -> None:
    plotted = dashboard_metrics(synthesized)
    for queue in synthesized.resources("AWS::SQS::Queue"):
        assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", f"<{queue}.QueueName>") in plotted, queue
    (age,) = (k for k, a in alarms(synthesized).items() if a["MetricName"] == "ApproximateAgeOfOldestMessage")
    (dashboard,) = synthesized.resources("AWS::CloudWatch::Dashboard").values()
    assert f"<{age}.Arn>" in render(dashboard["Properties"]["DashboardBody"], {})


def test_an_unlabelled_distributed_map_is_refused(tmp_path: Path) -> None:
    """Its child executions would report under a per-run UUID that no dashboard can name."""
    definition = json.loads(ASL.read_text())
    del definition["States"]["Check files"]["Label"]
    (tmp_path / "backfill.asl.json").write_text(json.dumps(definition))
    with pytest.raises(ValueError, match=re.escape("backfill.asl.json: Distributed Map 'Check files' has no Label")):
        distributed_maps(tmp_path / "backfill.asl.json")


def test_a_published_chunk_longer_than_a_piece_is_refreshed_piece_by_piece_from_a_queue(synthesized: Synthesized) -> None:
    """The rollup Lambda puts the pieces of a long chunk on its work queue and takes them back one a
    message, at most ROLLUP_CONCURRENCY at once; a piece that fails three times goes to RollupFailures."""
    (work, props), = ((k, v["Properties"]) for k, v in synthesized.resources("AWS::SQS::Queue").items() if k.startswith("RollupWork"))
    failures = next(q for q in synthesized.resources("AWS::SQS::Queue") if q.startswith("RollupFailures"))
    assert props["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [failures, "Arn"]}, "maxReceiveCount": 3}
    assert props["VisibilityTimeout"] >= 6 * int(FUNCTIONS["rollup"].timeout.to_seconds()) and props["SqsManagedSseEnabled"] is True
    logical, fn = functions(synthesized)["rollup"]
    (mapping,) = synthesized.resources("AWS::Lambda::EventSourceMapping").values()
    assert mapping["Properties"] == {"BatchSize": 1, "EventSourceArn": {"Fn::GetAtt": [work, "Arn"]}, "FunctionName": {"Ref": logical},
                                     "ScalingConfig": {"MaximumConcurrency": ROLLUP_CONCURRENCY}}
    assert fn["Environment"]["Variables"]["ROLLUP_QUEUE_URL"] == {"Ref": work}
    granted = [s for s in statements(synthesized, fn["Role"]["Fn::GetAtt"][0]) if work in json.dumps(s["Resource"])]
    assert {"sqs:SendMessage", "sqs:ReceiveMessage", "sqs:DeleteMessage"} <= set().union(*(actions(s) for s in granted))
    others = [name for name, (_, props) in functions(synthesized).items() if name != "rollup"
              and any(work in json.dumps(s["Resource"]) for s in statements(synthesized, props["Role"]["Fn::GetAtt"][0]))]
    assert not others


def _synth(context: dict[str, Any]) -> Synthesized:
    app, _ = build_app({**feature_flags(), **NO_BUNDLING, **context})
    return Synthesized(app.synth().get_stack_by_name(STACK_NAME).template, {}, Path())


def _config(synthesized: Synthesized, function: str, names: dict[str, str]) -> LakeConfig:
    env = functions(synthesized)[function][1]["Environment"]["Variables"]
    return LakeConfig.model_validate_json(render(env["TIMELAKE_CONFIG"], names))


def test_catalog_context_chooses_the_glue_iceberg_rest_endpoint() -> None:
    """``-c catalog=glue-rest``: pyiceberg's REST client signing for Glue, the tables still in the stack's
    bucket and its Glue databases, and glue:GetCatalog (the endpoint's config call) for every engine role."""
    synthesized = _synth({"catalog": "glue-rest"})
    config = _config(synthesized, "publish", {data_bucket(synthesized): "data-bucket"})
    assert config.catalog_name == "glue-rest"
    assert config.catalog_props == {"type": "rest", "uri": "https://glue.eu-central-1.<AWS::URLSuffix>/iceberg",
                                    "warehouse": "123456789012", "rest.sigv4-enabled": "true", "rest.signing-name": "glue",
                                    "rest.signing-region": "eu-central-1", "s3.region": "eu-central-1"}
    assert {r["Properties"]["DatabaseInput"]["Name"] for r in synthesized.resources("AWS::Glue::Database").values()} == {DATABASE, "iot"}
    for name, (_, props) in functions(synthesized).items():
        granted = set().union(*map(actions, statements(synthesized, props["Role"]["Fn::GetAtt"][0])))
        assert ("glue:GetCatalog" in granted) == FUNCTIONS[name].engine, name


def test_catalog_context_chooses_s3_tables_with_its_own_table_bucket() -> None:
    """``-c catalog=s3tables``: a table bucket (kept when the stack goes) with a namespace per database, the
    S3 Tables REST endpoint signing for s3tables, and the s3tables actions instead of Glue and of the
    stack bucket's warehouse prefixes: commits only where the step commits, data puts only where it writes."""
    synthesized = _synth({"catalog": "s3tables"})
    (bucket_id, bucket), = synthesized.resources("AWS::S3Tables::TableBucket").items()
    assert bucket["Properties"]["TableBucketName"] == "timelake-backfill" and bucket["DeletionPolicy"] == "Retain"
    assert {r["Properties"]["Namespace"] for r in synthesized.resources("AWS::S3Tables::Namespace").values()} == {DATABASE, "iot"}
    assert synthesized.resources("AWS::Glue::Database") == {}
    config = _config(synthesized, "write", {})
    assert config.catalog_name == "s3tables" and config.catalog_props["warehouse"] == f"<{bucket_id}.TableBucketARN>"
    assert config.catalog_props["uri"] == "https://s3tables.eu-central-1.<AWS::URLSuffix>/iceberg"
    assert config.catalog_props["rest.signing-name"] == "s3tables" and config.staging.endswith("/_backfill")
    for name, (_, props) in functions(synthesized).items():
        role = statements(synthesized, props["Role"]["Fn::GetAtt"][0])
        granted = set().union(*map(actions, role))
        spec = FUNCTIONS[name]
        assert not any(a.startswith("glue:") for a in granted), name
        assert ("s3tables:GetTableData" in granted) == spec.engine, name
        assert ("s3tables:UpdateTableMetadataLocation" in granted) == spec.commits, name
        assert ("s3tables:PutTableData" in granted) == (spec.commits or spec.writes_data), name
        assert "warehouse/" not in json.dumps([s["Resource"] for s in role if "s3:PutObject" in actions(s)]), name


@pytest.mark.parametrize(("context", "message"), [
    ({"catalog": "nessie"}, "context catalog: 'nessie' is not one of glue, glue-rest, s3tables"),
    ({"tableBucketArn": "arn:aws:s3tables:eu-central-1:123456789012:bucket/lake"}, "context tableBucketArn applies to catalog=s3tables only"),
    ({"catalog": "s3tables", "tableBucketArn": "lake"}, "context tableBucketArn: 'lake' is not a table bucket ARN"),
])
def test_bad_catalog_context_is_refused_with_its_name(context: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings.from_context(context.get)
