"""The AWS deployment of the backfill: one stack holding storage, catalog, job store, workflow,
API, events and monitoring. The handlers (`functions/`) and the workflow
(`statemachine/backfill.asl.json`) are written elsewhere; this stack only wires them up, so
the interfaces it relies on are the handler names, the ``${...}`` substitutions and the
``TIMELAKE_CONFIG`` JSON that `timelake.ports.runtime.LakeConfig` parses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import Aws, CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_glue as glue
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3tables as s3tables
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from timelake.aws.store import TTL_ATTRIBUTE, table_definition
from timelake.model.spec import JobSpec

from .layer import ENGINE_LAYER, REPO, engine_layer_code

ASL = REPO / "statemachine" / "backfill.asl.json"
FUNCTIONS_DIR = REPO / "functions"
DATABASE = "timelake"  # the stack's own database; `glueDatabases` adds more (default: iot, the README's)
DEFAULT_DATABASES = ("iot",)
DEFAULT_SOURCE_BUCKETS = ("old-historian",)  # the README example's export bucket (examples/job.json)
DEFAULT_SCAN_CONCURRENCY = 100
DEFAULT_WRITE_CONCURRENCY = 200
DEFAULT_UNIT_TTL_DAYS = 30
# Above the ~9 h a headline year's follow-up takes to drain at ROLLUP_CONCURRENCY (365 day pieces of
# 864M rows, ~6 min each at the rollup bench's ~2M rows a CPU-second), so a deep but moving backlog
# does not page anyone; a consumer that stopped still shows within half a day, long before the
# queue's 14 days of retention run out.
DEFAULT_ROLLUP_WORK_MAX_AGE_HOURS = 12
EVENT_BUS = "timelake-backfill"
STAGING_PREFIX = "_backfill/"
WAREHOUSE_PREFIX = "warehouse"
SERVICE = "timelake-backfill"
METRICS_NAMESPACE = "Timelake"
LOG_RETENTION = logs.RetentionDays.THREE_MONTHS
STAGING_EXPIRY = Duration.days(14)  # Step Functions redrives within 14 days: staging must outlive that
TABLE_DATA = f"{WAREHOUSE_PREFIX}/*/data/*"  # <db>.db/<table>/data/...: data files, never metadata
TABLE_METADATA = f"{WAREHOUSE_PREFIX}/*/metadata/*"
FACTS = f"{STAGING_PREFIX}*/validate/*"  # <job>/validate/...: the check items and each staged file's facts
DIFF = f"{STAGING_PREFIX}*/diff/*"  # <job>/diff/...: the diff's main tasks, spills, cells and result
# The record tables a publish appends to: provenance (timelake.backfills) and each table's coverage companion.
RECORD_DATA = (f"{WAREHOUSE_PREFIX}/{DATABASE}.db/backfills/data/*", f"{WAREHOUSE_PREFIX}/*__coverage/data/*")


# The catalog the deployment's tables live in (CDK context ``catalog``): Glue through pyiceberg's Glue
# client, the Glue Iceberg REST endpoint, or S3 Tables' Iceberg REST endpoint; both REST endpoints sign
# with SigV4 (the Lambda role's credentials). The catalog's name is the kind's.
CATALOG_KINDS = ("glue", "glue-rest", "s3tables")
DEFAULT_TABLE_BUCKET = "timelake-backfill"  # the table bucket the stack makes for ``catalog=s3tables`` without ``tableBucketArn``
TABLE_BUCKET_ARN = r"arn:aws[a-z-]*:s3tables:[a-z0-9-]+:\d{12}:bucket/[a-z0-9-]{3,63}"


@dataclass(frozen=True)
class Settings:
    """What a deployer chooses (CDK context, see `from_context`); the defaults run the README example."""

    databases: tuple[str, ...] = DEFAULT_DATABASES
    source_buckets: tuple[str, ...] = DEFAULT_SOURCE_BUCKETS  # "bucket" or "bucket/prefix"
    alarm_email: str | None = None
    alarm_topic_arn: str | None = None  # an existing operators' topic instead of a new one
    scan_concurrency: int = DEFAULT_SCAN_CONCURRENCY
    write_concurrency: int = DEFAULT_WRITE_CONCURRENCY
    unit_ttl_days: int = DEFAULT_UNIT_TTL_DAYS
    rollup_work_max_age_hours: int = DEFAULT_ROLLUP_WORK_MAX_AGE_HOURS  # the RollupWork age alarm's threshold
    catalog: str = "glue"  # one of CATALOG_KINDS
    table_bucket_arn: str | None = None  # catalog s3tables: an existing table bucket (None: the stack makes one)

    @classmethod
    def from_context(cls, get: Any) -> Settings:
        """``get`` is ``node.try_get_context``. Lists may be JSON lists (cdk.json) or comma-separated
        strings (``cdk deploy -c sourceBuckets=a,b/prefix``)."""
        def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            value = get(key)
            if value is None:
                return default
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(i.strip().strip("/") for i in items if i.strip())

        def number(key: str, default: int) -> int:
            value = get(key)
            try:
                result = default if value is None else int(value)
            except (TypeError, ValueError):
                raise ValueError(f"context {key} must be a whole number, got {value!r}") from None
            if result < 1:
                raise ValueError(f"context {key} must be at least 1, got {result}")
            return result

        settings = cls(databases=names("glueDatabases", DEFAULT_DATABASES), source_buckets=names("sourceBuckets", DEFAULT_SOURCE_BUCKETS),
                       alarm_email=get("alarmEmail") or None, alarm_topic_arn=get("alarmTopicArn") or None,
                       scan_concurrency=number("scanConcurrency", DEFAULT_SCAN_CONCURRENCY),
                       write_concurrency=number("writeConcurrency", DEFAULT_WRITE_CONCURRENCY),
                       unit_ttl_days=number("unitTtlDays", DEFAULT_UNIT_TTL_DAYS),
                       rollup_work_max_age_hours=number("rollupWorkMaxAgeHours", DEFAULT_ROLLUP_WORK_MAX_AGE_HOURS),
                       catalog=str(get("catalog") or "glue"), table_bucket_arn=get("tableBucketArn") or None)
        if settings.catalog not in CATALOG_KINDS:
            raise ValueError(f"context catalog: '{settings.catalog}' is not one of {', '.join(CATALOG_KINDS)}")
        if settings.table_bucket_arn and settings.catalog != "s3tables":
            raise ValueError("context tableBucketArn applies to catalog=s3tables only")
        if settings.table_bucket_arn and not re.fullmatch(TABLE_BUCKET_ARN, settings.table_bucket_arn):
            raise ValueError(f"context tableBucketArn: '{settings.table_bucket_arn}' is not a table bucket ARN "
                             "(arn:aws:s3tables:REGION:ACCOUNT:bucket/NAME)")
        for db in settings.databases:
            if not re.fullmatch(r"[a-z0-9_]{1,255}", db):
                raise ValueError(f"context glueDatabases: '{db}' is not a Glue database name (lower case, digits, _)")
        return settings

    @property
    def all_databases(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((DATABASE, *self.databases)))


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda and what it may touch (least privilege: each role gets only these grants)."""

    memory: int
    timeout: Duration
    engine: bool = False  # reads lake files and the Glue catalog
    commits: bool = False  # commits to Iceberg (branch create, stage, publish): glue:UpdateTable + table metadata files
    reads_sources: bool = False  # reads the job's source files, which may live in ``source_buckets``
    put_events: bool = False
    scratch: bool = False  # writes the job's scratch files under staging (manifests, spills, failure notes)
    writes_facts: bool = False  # writes only validation's files under staging (`FACTS`: check items, per-file facts)
    writes_diff: bool = False  # writes only the diff's files under staging (`DIFF`: the job's diff, once combined)
    clears_scratch: bool = False  # deletes the job's scratch files (re-plan, end of publish, abort)
    writes_data: bool = False  # puts new data files under a table's data/ folder
    deletes_data: bool = False  # deletes data files of a table (abort: unpublished files; rollup: replaced chunks)
    writes_records: bool = False  # appends to the provenance and coverage tables (`RECORD_DATA`)
    duckdb: bool = True  # may import DuckDB (validation SQL, rollups, DuckDB/line-protocol sources, dry run); False: no DuckDB layer

    def layers(self) -> tuple[str, ...]:
        """The layers (`infra.layer.LAYERS`) this function gets: only what its code can import."""
        return (ENGINE_LAYER, *(["duckdb"] if self.duckdb else []), *(["postgres"] if self.reads_sources else []))


FUNCTIONS: dict[str, FunctionSpec] = {
    "plan": FunctionSpec(3008, Duration.minutes(15), engine=True, reads_sources=True, scratch=True, clears_scratch=True),
    "scan": FunctionSpec(3008, Duration.minutes(15), engine=True, reads_sources=True, scratch=True),
    "cut": FunctionSpec(3008, Duration.minutes(15), engine=True, commits=True, scratch=True, duckdb=False),  # forks the job's branch
    "write": FunctionSpec(3008, Duration.minutes(15), engine=True, scratch=True, writes_data=True, duckdb=False),  # reads the scan spills
    "stage": FunctionSpec(2048, Duration.minutes(15), engine=True, commits=True, writes_diff=True, duckdb=False),  # and combines the diff
    "validate": FunctionSpec(2048, Duration.minutes(15), engine=True, writes_facts=True),  # lists the check items, combines the facts
    # one staged file's checks, a batch at a time, on one thread: 1,769 MB is one full vCPU, and less
    # memory would only slow it down at the same GB-seconds
    "validate_item": FunctionSpec(1769, Duration.minutes(15), engine=True, writes_facts=True, duckdb=False),
    "publish": FunctionSpec(2048, Duration.minutes(15), engine=True, commits=True, put_events=True, clears_scratch=True,
                           writes_records=True, duckdb=False),
    "record_failure": FunctionSpec(512, Duration.seconds(30), duckdb=False),
    "canary": FunctionSpec(2048, Duration.minutes(15), engine=True, commits=True, reads_sources=True, scratch=True),  # stages, resets; samples the source
    "abort": FunctionSpec(1024, Duration.minutes(5), engine=True, commits=True, clears_scratch=True, deletes_data=True,
                         writes_records=True, duckdb=False),  # removes branch, files, lease
    "api": FunctionSpec(512, Duration.seconds(30), engine=True, duckdb=False),  # read-only on the lake: its abort route invokes the abort Lambda
    "rollup": FunctionSpec(2048, Duration.minutes(15), engine=True, commits=True, writes_data=True, deletes_data=True),  # swaps rollup chunks
}
WORKFLOW_FUNCTIONS = tuple(name for name in FUNCTIONS if name not in ("api", "rollup"))  # each is ${<Name>FunctionArn} in the ASL
RESERVED = {"scan": "scan_concurrency", "write": "write_concurrency"}
ROLLUP_CONCURRENCY = 4  # pieces of follow-up work at once: they commit to the same rollup tables, more would mostly retry
ROLLUP_VISIBILITY = Duration.minutes(90)  # 6 x the rollup Lambda's timeout, as AWS advises for a queue a Lambda consumes  # Settings field holding each one's reserved concurrency
API_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/backfills"), ("GET", "/backfills"), ("GET", "/backfills/{id}"),
    ("GET", "/backfills/{id}/report"), ("POST", "/backfills/{id}/resume"), ("POST", "/backfills/{id}/abort"),
    ("POST", "/backfills/{id}/approve"), ("POST", "/backfills/{id}/reject"), ("POST", "/backfills/{id}/settings"),
    ("GET", "/tables/{table}/coverage"),
)
LAYER_DESCRIPTIONS = {
    ENGINE_LAYER: "timelake engine with pyarrow, pyiceberg, numpy, pydantic and Powertools (aarch64, CPython 3.12)",
    "duckdb": "DuckDB for the functions that run SQL (aarch64, CPython 3.12)",
    "postgres": "ADBC PostgreSQL driver for the functions that read PostgreSQL sources (aarch64, CPython 3.12)",
}
GLUE_READ = ["glue:GetDatabase", "glue:GetDatabases", "glue:GetTable", "glue:GetTables"]
GLUE_REST = ["glue:GetCatalog"]  # the Glue Iceberg REST endpoint's config call, on top of the table actions
# S3 Tables' REST endpoint: the actions each call needs (load: metadata location + data; commit: new
# metadata location + the metadata file written into table storage).
S3TABLES_READ = ["s3tables:GetTableBucket", "s3tables:ListNamespaces", "s3tables:GetNamespace", "s3tables:ListTables",
                 "s3tables:GetTable", "s3tables:GetTableMetadataLocation", "s3tables:GetTableData"]
S3TABLES_COMMIT = ["s3tables:UpdateTableMetadataLocation", "s3tables:PutTableData", "s3tables:CreateTable",
                   "s3tables:CreateNamespace"]
S3TABLES_WRITE = ["s3tables:PutTableData"]
GLUE_COMMIT = ["glue:UpdateTable", "glue:CreateTable"]  # CreateTable: companion tables made on first use (provenance, coverage)
DYNAMODB_READ_WRITE = [
    "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:Scan", "dynamodb:DescribeTable",
    "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
]


class BackfillStack(Stack):
    """Everything a deployment needs, shaped by `Settings`: the Glue databases the functions may use
    (each created here), the source buckets/prefixes they may read, who gets the alarms, and the
    reserved concurrency of scan and write."""

    def __init__(self, scope: Construct, construct_id: str, *, asl_path: Path = ASL,
                 settings: Settings = Settings(), **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.source_buckets = tuple(dict.fromkeys(s.split("/", 1)[0] for s in settings.source_buckets))
        self.access_logs = self._access_log_bucket()
        self.bucket = self._data_bucket()
        self.table_bucket: s3tables.CfnTableBucket | None = None
        self.table_bucket_arn = self._table_bucket() if settings.catalog == "s3tables" else None
        if settings.catalog == "s3tables":
            self.databases = {db: s3tables.CfnNamespace(
                self, "Namespace" if db == DATABASE else f"Namespace{_pascal(db)}", namespace=db,
                table_bucket_arn=self.table_bucket_arn) for db in settings.all_databases}
        else:
            self.databases = {db: glue.CfnDatabase(
                self, "Database" if db == DATABASE else f"Database{_pascal(db)}", catalog_id=self.account,
                database_input=glue.CfnDatabase.DatabaseInputProperty(
                    name=db, description="Iceberg tables loaded by timelake backfill",
                    location_uri=self.bucket.s3_url_for_object(f"{WAREHOUSE_PREFIX}/{db}.db"))) for db in settings.all_databases}
        self.database = self.databases[DATABASE]
        self.jobs_table = self._jobs_table()
        self.alarm_topic = sns.Topic(
            self, "AlarmTopic", display_name="timelake real-time alarms", enforce_ssl=True,
            master_key=kms.Alias.from_alias_name(self, "SnsManagedKey", "alias/aws/sns"))
        self.operators = self._operators_topic()
        self.bus = events.EventBus(self, "EventBus", event_bus_name=EVENT_BUS,
                                   description="Backfill lifecycle events (Backfill Published) for rollup refresh")
        self.layers = {name: lambda_.LayerVersion(
            self, "EngineLayer" if name == ENGINE_LAYER else f"{_pascal(name)}Layer", code=engine_layer_code(name),
            compatible_runtimes=[lambda_.Runtime.PYTHON_3_12], compatible_architectures=[lambda_.Architecture.ARM_64],
            description=LAYER_DESCRIPTIONS[name]) for name in LAYER_DESCRIPTIONS}
        self.functions = {name: self._function(name, spec) for name, spec in FUNCTIONS.items()}
        self.state_machine = self._state_machine(asl_path)
        self.maps = distributed_maps(asl_path)
        self._grant_api()
        self.api = self._api()
        self.failed_alarm = self._alarm("ExecutionsFailedAlarm", "A backfill execution failed: see the job's failure and the execution history",
                                        self.state_machine.metric_failed(period=Duration.minutes(5), statistic=cw.Stats.SUM))
        self.rollup_failures = self._rollup_failures()
        self.rollup_work = self._rollup_work()
        self.rollup_rule = self._rollup_rule()
        self._operations_alarms()
        self.dashboard = self._dashboard()
        for name, value in {
            "BucketName": self.bucket.bucket_name, "JobsTableName": self.jobs_table.table_name,
            "StateMachineArn": self.state_machine.state_machine_arn, "ApiUrl": self.api.url,
            "OperatorsTopicArn": self.operators.topic_arn,
            "EventBusName": self.bus.event_bus_name, "GlueDatabase": DATABASE, "AlarmTopicArn": self.alarm_topic.topic_arn,
            "LakeConfig": self.lake_config(),  # read by `timelake ... --on aws`
        }.items():
            CfnOutput(self, name, value=value)

    def catalog_props(self) -> dict[str, str]:
        """pyiceberg's properties of the chosen catalog (`Settings.catalog`). Both REST endpoints sign with
        SigV4 using the function's own role; table data is in the stack's bucket except on S3 Tables,
        whose tables keep their files in the table bucket's own storage."""
        kind = self.settings.catalog
        if kind == "glue":
            return {"type": "glue", "warehouse": self.bucket.s3_url_for_object(WAREHOUSE_PREFIX),
                    "glue.id": Aws.ACCOUNT_ID, "glue.region": Aws.REGION, "s3.region": Aws.REGION}
        signing = {"rest.sigv4-enabled": "true", "rest.signing-region": Aws.REGION, "s3.region": Aws.REGION}
        if kind == "glue-rest":
            return {"type": "rest", "uri": f"https://glue.{Aws.REGION}.{Aws.URL_SUFFIX}/iceberg", "warehouse": Aws.ACCOUNT_ID,
                    "rest.signing-name": "glue", **signing}
        return {"type": "rest", "uri": f"https://s3tables.{Aws.REGION}.{Aws.URL_SUFFIX}/iceberg",
                "warehouse": self.table_bucket_arn, "rest.signing-name": "s3tables", **signing}

    def lake_config(self) -> str:
        """``TIMELAKE_CONFIG``: `timelake.ports.runtime.LakeConfig` as JSON, tokens resolved at deploy time."""
        return self.to_json_string({
            "catalog_name": self.settings.catalog,
            "catalog_props": self.catalog_props(),
            "store": f"dynamodb://{self.jobs_table.table_name}?unit_ttl_days={self.settings.unit_ttl_days}",
            "staging": self.bucket.s3_url_for_object(STAGING_PREFIX.rstrip("/")),
            "events": f"eventbridge://{self.bus.event_bus_name}",
            # The live path publishes here; no role of this stack may (historical data never pages anyone).
            "alarms": f"sns://{self.alarm_topic.topic_arn}",
            # The scan role reads lake data only: every partition goes through the spill to the write Lambdas.
            "scan_writes": False,
        })

    def _table_bucket(self) -> str:
        """The S3 Tables table bucket: ``tableBucketArn``, or one made here (kept when the stack goes)."""
        if self.settings.table_bucket_arn:
            return self.settings.table_bucket_arn
        self.table_bucket = s3tables.CfnTableBucket(self, "TableBucket", table_bucket_name=DEFAULT_TABLE_BUCKET)
        self.table_bucket.apply_removal_policy(RemovalPolicy.RETAIN)
        return self.table_bucket.attr_table_bucket_arn

    def _access_log_bucket(self) -> s3.Bucket:
        return s3.Bucket(
            self, "AccessLogs", encryption=s3.BucketEncryption.S3_MANAGED, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True, object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED, removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(365))])

    def _data_bucket(self) -> s3.Bucket:
        """Warehouse and staging. Not versioned: Iceberg never overwrites a data or metadata file
        (the table's snapshots are its history), and versioning would keep every file that
        snapshot expiry deletes."""
        return s3.Bucket(
            self, "Data", encryption=s3.BucketEncryption.S3_MANAGED, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True, removal_policy=RemovalPolicy.RETAIN,
            server_access_logs_bucket=self.access_logs, server_access_logs_prefix="data/",
            lifecycle_rules=[
                s3.LifecycleRule(id="expire-staging", prefix=STAGING_PREFIX, expiration=STAGING_EXPIRY),
                s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(1)),
            ])

    def _jobs_table(self) -> dynamodb.Table:
        """Mirrors `table_definition()` (the store's own CreateTable arguments), so the store
        and the deployed table cannot drift."""
        spec = table_definition()
        if spec["BillingMode"] != "PAY_PER_REQUEST":
            raise ValueError(f"the jobs table is on-demand, the store asks for {spec['BillingMode']}")
        types = {a["AttributeName"]: dynamodb.AttributeType(_ATTRIBUTE_TYPES[a["AttributeType"]]) for a in spec["AttributeDefinitions"]}

        def keys(schema: list[dict[str, str]]) -> dict[str, dynamodb.Attribute]:
            return {("partition_key" if k["KeyType"] == "HASH" else "sort_key"): dynamodb.Attribute(name=k["AttributeName"], type=types[k["AttributeName"]])
                    for k in schema}

        table = dynamodb.Table(
            self, "JobsTable", billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST, removal_policy=RemovalPolicy.RETAIN,
            deletion_protection=True, time_to_live_attribute=TTL_ATTRIBUTE,  # finished jobs' unit items expire (the store sets it)
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(point_in_time_recovery_enabled=True),
            **keys(spec["KeySchema"]))
        for index in spec.get("GlobalSecondaryIndexes", []):
            projection = index["Projection"]
            table.add_global_secondary_index(
                index_name=index["IndexName"], projection_type=dynamodb.ProjectionType(projection["ProjectionType"]),
                non_key_attributes=projection.get("NonKeyAttributes"), **keys(index["KeySchema"]))
        self.index_names = [index["IndexName"] for index in spec.get("GlobalSecondaryIndexes", [])]
        return table

    def _function(self, name: str, spec: FunctionSpec) -> lambda_.Function:
        """Each function has its own role with only its grants (no AWS managed policy: logs are
        granted on the function's own log group)."""
        log_group = logs.LogGroup(self, f"{_pascal(name)}Logs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY)
        role = iam.Role(self, f"{_pascal(name)}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=f"timelake backfill {name} Lambda")
        log_group.grant_write(role)
        fn = lambda_.Function(
            self, f"{_pascal(name)}Function", runtime=lambda_.Runtime.PYTHON_3_12, architecture=lambda_.Architecture.ARM_64,
            handler="app.handler", code=lambda_.Code.from_asset(str(FUNCTIONS_DIR / name), exclude=["__pycache__", "*.pyc"]),
            layers=[self.layers[layer] for layer in spec.layers()], memory_size=spec.memory, timeout=spec.timeout, role=role, log_group=log_group,
            reserved_concurrent_executions=getattr(self.settings, RESERVED[name]) if name in RESERVED else None,
            tracing=lambda_.Tracing.ACTIVE, description=f"timelake backfill: {name.replace('_', ' ')}",
            environment={
                "TIMELAKE_CONFIG": self.lake_config(), "POWERTOOLS_SERVICE_NAME": SERVICE,
                "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE, "POWERTOOLS_LOG_LEVEL": "INFO",
            })
        role.add_to_policy(iam.PolicyStatement(actions=DYNAMODB_READ_WRITE, resources=[
            self.jobs_table.table_arn, *(f"{self.jobs_table.table_arn}/index/{index}" for index in self.index_names)]))
        if spec.engine:
            self._grant_lake(role, spec)
        if spec.reads_sources:
            for source in self.settings.source_buckets:
                bucket, _, prefix = source.partition("/")
                role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[
                    f"arn:{Aws.PARTITION}:s3:::{bucket}/{prefix + '/' if prefix else ''}*"]))
            for bucket in self.source_buckets:
                role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[f"arn:{Aws.PARTITION}:s3:::{bucket}"]))
        if spec.put_events:
            self.bus.grant_put_events_to(role)
        return fn

    def _grant_lake(self, role: iam.Role, spec: FunctionSpec) -> None:
        """Least privilege on the lake, by what the step does: every engine step reads the bucket and
        the configured Glue databases; only some write scratch files under staging, put data files,
        commit (table metadata + glue:UpdateTable) or delete, each on the narrowest prefix."""
        role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects("*")]))
        role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[self.bucket.bucket_arn]))
        in_bucket = self.settings.catalog != "s3tables"  # S3 Tables keeps table files in its own storage
        # pyarrow's delete_dir re-creates the parent folder's marker object: clearing scratch puts too.
        put = ([f"{STAGING_PREFIX}*"] if spec.scratch or spec.clears_scratch else
               [FACTS] if spec.writes_facts else [DIFF] if spec.writes_diff else []) + \
            ([TABLE_DATA] if spec.writes_data and in_bucket else []) + ([TABLE_METADATA] if spec.commits and in_bucket else []) + \
            (list(RECORD_DATA) if spec.writes_records and not spec.writes_data and in_bucket else [])
        if put:
            role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                                                   resources=[self.bucket.arn_for_objects(p) for p in put]))
        delete = ([f"{STAGING_PREFIX}*"] if spec.clears_scratch else []) + ([TABLE_DATA] if spec.deletes_data and in_bucket else [])
        if delete:
            role.add_to_policy(iam.PolicyStatement(actions=["s3:DeleteObject"], resources=[self.bucket.arn_for_objects(p) for p in delete]))
        if not in_bucket:
            role.add_to_policy(iam.PolicyStatement(
                actions=S3TABLES_READ + (S3TABLES_COMMIT if spec.commits else S3TABLES_WRITE if spec.writes_data else []),
                resources=[self.table_bucket_arn, f"{self.table_bucket_arn}/table/*"]))
            return
        glue_arn = f"arn:{Aws.PARTITION}:glue:{Aws.REGION}:{Aws.ACCOUNT_ID}"
        dbs = self.settings.all_databases
        role.add_to_policy(iam.PolicyStatement(
            actions=GLUE_READ + (GLUE_REST if self.settings.catalog == "glue-rest" else []) + (GLUE_COMMIT if spec.commits else []),
            resources=[f"{glue_arn}:catalog", *(f"{glue_arn}:database/{db}" for db in dbs), *(f"{glue_arn}:table/{db}/*" for db in dbs)]))

    def _state_machine(self, asl_path: Path) -> sfn.StateMachine:
        """The workflow from its JSON file, inlined so the template shows it. Its Distributed Map
        is invisible to CDK's automatic grants, so the role gets them from a separate policy
        (a grant on the role itself would make the role depend on the state machine and back)."""
        log_group = logs.LogGroup(self, "WorkflowLogs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY,
                                  log_group_name=f"/aws/vendedlogs/states/{self.stack_name}-backfill")
        substitutions = {f"{_pascal(name)}FunctionArn": self.functions[name].function_arn for name in WORKFLOW_FUNCTIONS}
        machine = sfn.StateMachine(
            self, "Workflow", state_machine_type=sfn.StateMachineType.STANDARD, tracing_enabled=True,
            definition_body=sfn.DefinitionBody.from_string(asl_path.read_text()),
            definition_substitutions={**substitutions, "StagingBucket": self.bucket.bucket_name},
            # Execution data stays in the logs: state payloads are small references (unit lists
            # travel through S3) with no secrets, and a failure is then diagnosable from the logs.
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True))
        states = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}"
        name = machine.state_machine_name
        iam.Policy(self, "WorkflowDistributedMapPolicy", roles=[machine.role], statements=[
            iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[self.functions[n].function_arn for n in WORKFLOW_FUNCTIONS]),
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[machine.state_machine_arn]),
            iam.PolicyStatement(actions=["states:DescribeExecution", "states:StopExecution", "states:RedriveExecution"],
                                resources=[f"{states}:execution:{name}:*", f"{states}:execution:{name}/*"]),
            iam.PolicyStatement(actions=["states:ListMapRuns"], resources=[f"{states}:execution:{name}:*"]),
            iam.PolicyStatement(actions=["states:DescribeMapRun", "states:UpdateMapRun"], resources=[f"{states}:mapRun:{name}/*"]),
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{STAGING_PREFIX}*")]),
            # the Maps' ResultWriter: child results go to S3, not into the state (its size stays flat)
            iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
                                resources=[self.bucket.arn_for_objects(f"{STAGING_PREFIX}*")]),
        ])
        return machine

    def _grant_api(self) -> None:
        fn = self.functions["api"]
        fn.add_environment("STATE_MACHINE_ARN", self.state_machine.state_machine_arn)
        fn.add_environment("ABORT_FUNCTION_ARN", self.functions["abort"].function_arn)
        fn.add_to_role_policy(iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[self.functions["abort"].function_arn]))
        states = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}"
        fn.add_to_role_policy(iam.PolicyStatement(actions=["states:StartExecution", "states:ListExecutions"],
                                                  resources=[self.state_machine.state_machine_arn]))
        # approve/reject answer the canary's task token; the token's resource is the state machine
        fn.add_to_role_policy(iam.PolicyStatement(actions=["states:SendTaskSuccess", "states:SendTaskFailure"],
                                                  resources=[self.state_machine.state_machine_arn]))
        fn.add_to_role_policy(iam.PolicyStatement(actions=["states:DescribeExecution", "states:RedriveExecution", "states:StopExecution"],
                                                  resources=[f"{states}:execution:{self.state_machine.state_machine_name}:*"]))
        # settings mid-job: the concurrency of the job's running Map runs
        fn.add_to_role_policy(iam.PolicyStatement(actions=["states:ListMapRuns"],
                                                  resources=[f"{states}:execution:{self.state_machine.state_machine_name}:*"]))
        fn.add_to_role_policy(iam.PolicyStatement(actions=["states:UpdateMapRun"],
                                                  resources=[f"{states}:mapRun:{self.state_machine.state_machine_name}/*"]))

    def _api(self) -> apigw.RestApi:
        """REST API with IAM (SigV4) auth on every method. Bodies are checked against the job
        model's required fields here; the handler validates the full model (422 on bad input)."""
        access_logs = logs.LogGroup(self, "ApiAccessLogs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY)
        api = apigw.RestApi(
            self, "Api", rest_api_name=SERVICE, description="Start, list, inspect, resume, approve, reject and abort backfills, change their settings; a table's coverage",
            endpoint_types=[apigw.EndpointType.REGIONAL], cloud_watch_role=True,
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
            deploy_options=apigw.StageOptions(
                stage_name="v1", tracing_enabled=True, metrics_enabled=True, logging_level=apigw.MethodLoggingLevel.ERROR,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True, http_method=True, ip=True, protocol=True, request_time=True, resource_path=True,
                    response_length=True, status=True, user=True)))
        api.node.try_remove_child("Endpoint")  # its own URL output; the stack's ApiUrl replaces it
        validator = api.add_request_validator("RequestValidator", validate_request_body=True, validate_request_parameters=True)
        job_model = api.add_model("JobModel", content_type="application/json", model_name="Job", schema=_job_schema())
        integration = apigw.LambdaIntegration(self.functions["api"], allow_test_invoke=False)
        for method, path in API_ROUTES:
            resource = api.root.resource_for_path(path)
            params = {f"method.request.path.{p}": True for p in ("id", "table") if f"{{{p}}}" in path}
            body = {"application/json": job_model} if (method, path) == ("POST", "/backfills") else None
            resource.add_method(method, integration, request_validator=validator, request_parameters=params or None, request_models=body)
        return api

    def _operators_topic(self) -> sns.ITopic:
        """Where every alarm goes: ``alarmTopicArn`` (an existing topic) or a new topic encrypted with
        a customer-managed key (CloudWatch cannot publish to a topic under the AWS-managed
        alias/aws/sns key: its key policy cannot name the CloudWatch service), with ``alarmEmail``
        subscribed when given. Separate from the real-time data-alarm topic of the live path."""
        if self.settings.alarm_topic_arn:
            topic = sns.Topic.from_topic_arn(self, "OperatorsTopic", self.settings.alarm_topic_arn)
        else:
            key = kms.Key(self, "OperatorsTopicKey", enable_key_rotation=True, removal_policy=RemovalPolicy.RETAIN,
                          description="Encrypts the timelake backfill operators' alarm topic; CloudWatch may use it to publish")
            key.add_to_resource_policy(iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")], actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"], conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))
            topic = sns.Topic(self, "OperatorsTopic", display_name="timelake backfill operators", enforce_ssl=True, master_key=key)
        if self.settings.alarm_email:
            topic.add_subscription(subscriptions.EmailSubscription(self.settings.alarm_email))
        return topic

    def _alarm(self, construct_id: str, description: str, metric: cw.IMetric, threshold: float = 1) -> cw.Alarm:
        """Fires when one 5-minute period reaches ``threshold`` (by default one event) and tells the operators."""
        alarm = cw.Alarm(self, construct_id, alarm_description=description, metric=metric, threshold=threshold, evaluation_periods=1,
                         comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                         treat_missing_data=cw.TreatMissingData.NOT_BREACHING)
        alarm.add_alarm_action(cw_actions.SnsAction(self.operators))
        return alarm

    def _operations_alarms(self) -> None:
        period = Duration.minutes(5)
        for name, fn in self.functions.items():
            label = name.replace("_", " ")
            self._alarm(f"{_pascal(name)}ErrorsAlarm", f"The {label} Lambda failed (the workflow retries; see its logs)",
                        fn.metric_errors(period=period, statistic=cw.Stats.SUM))
            self._alarm(f"{_pascal(name)}ThrottlesAlarm", f"The {label} Lambda was throttled (reserved or account concurrency)",
                        fn.metric_throttles(period=period, statistic=cw.Stats.SUM))
        for construct_id, queue, what in (("RollupDeadLettersAlarm", self.rollup_dead_letters, "rollup events EventBridge could not deliver"),
                                          ("RollupFailuresAlarm", self.rollup_failures, "rollups that failed after their retries")):
            self._alarm(construct_id, f"{what}: the queue holds them for 14 days; replay or inspect",
                        queue.metric_approximate_number_of_messages_visible(period=period, statistic=cw.Stats.MAXIMUM))
        hours = self.settings.rollup_work_max_age_hours
        self.rollup_work_age_alarm = self._alarm(
            "RollupWorkAgeAlarm", f"A piece of follow-up work has waited {hours} h or more on the RollupWork queue: the rollup "
            f"Lambda is not taking pieces (event source mapping, concurrency) or the backlog outgrows {ROLLUP_CONCURRENCY} at once; "
            "see its logs",
            self.rollup_work.metric_approximate_age_of_oldest_message(period=period, statistic=cw.Stats.MAXIMUM),
            threshold=Duration.hours(hours).to_seconds())

    def _rollup_failures(self) -> sqs.Queue:
        """The rollup Lambda's on-failure destination: an invocation that still fails after its two
        asynchronous retries lands here (with the event and the error) instead of being dropped."""
        queue = sqs.Queue(self, "RollupFailures", enforce_ssl=True, encryption=sqs.QueueEncryption.SQS_MANAGED,
                          retention_period=Duration.days(14))
        self.functions["rollup"].configure_async_invoke(on_failure=destinations.SqsDestination(queue), retry_attempts=2)
        return queue

    def _rollup_work(self) -> sqs.Queue:
        """The pieces of a published chunk longer than one piece of follow-up work (a day, or a month with
        daily rollups): the rollup Lambda puts them here on the event and takes them back one a message,
        ``ROLLUP_CONCURRENCY`` at once. A piece that fails three times moves to the failures queue."""
        fn = self.functions["rollup"]
        queue = sqs.Queue(self, "RollupWork", enforce_ssl=True, encryption=sqs.QueueEncryption.SQS_MANAGED,
                          retention_period=Duration.days(14), visibility_timeout=ROLLUP_VISIBILITY,
                          dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=3, queue=self.rollup_failures))
        queue.grant_send_messages(fn)
        fn.add_environment("ROLLUP_QUEUE_URL", queue.queue_url)
        fn.add_event_source(event_sources.SqsEventSource(queue, batch_size=1, max_concurrency=ROLLUP_CONCURRENCY))
        return queue

    def _rollup_rule(self) -> events.Rule:
        """"Backfill Published" → the rollup Lambda, retried for a day, then parked in a dead-letter queue."""
        dead_letters = self.rollup_dead_letters = sqs.Queue(
            self, "RollupDeadLetters", enforce_ssl=True, encryption=sqs.QueueEncryption.SQS_MANAGED, retention_period=Duration.days(14))
        rule = events.Rule(self, "BackfillPublished", event_bus=self.bus, description="Refresh rollups over published ranges",
                           event_pattern=events.EventPattern(source=["timelake.backfill"], detail_type=["Backfill Published"]))
        rule.add_target(targets.LambdaFunction(self.functions["rollup"], dead_letter_queue=dead_letters,
                                               retry_attempts=8, max_event_age=Duration.hours(24)))
        return rule

    def _dashboard(self) -> cw.Dashboard:
        period = Duration.minutes(5)
        machine = self.state_machine

        def search(metric: str, stat: str, fn: str, label: str) -> cw.MathExpression:
            """Matches the metric whatever dimensions Powertools adds (service, per-table ones)."""
            return cw.MathExpression(expression=f"{fn}(SEARCH('Namespace=\"{METRICS_NAMESPACE}\" MetricName=\"{metric}\"', '{stat}', 300))",
                                     label=label, period=period)

        def per_function(title: str, metric: str, stat: str) -> cw.GraphWidget:
            return cw.GraphWidget(title=title, width=8, left=[
                fn.metric(metric, statistic=stat, period=period, label=name) for name, fn in self.functions.items()])

        dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=f"{self.stack_name}-backfill", default_interval=Duration.days(1))
        dashboard.add_widgets(
            cw.GraphWidget(title="Backfill executions", width=12, left=[
                machine.metric_started(period=period, label="started"), machine.metric_succeeded(period=period, label="succeeded"),
                machine.metric_failed(period=period, label="failed"), machine.metric_aborted(period=period, label="aborted"),
                machine.metric_timed_out(period=period, label="timed out")]),
            cw.AlarmWidget(title="Failed executions", width=12, alarm=self.failed_alarm))
        dashboard.add_widgets(*(self._map_run_widget(label, name, period) for label, name in self.maps.items()))
        items = {name: self.functions[name] for name in self.maps.values()}
        dashboard.add_widgets(
            cw.GraphWidget(title="Map-run progress: successful item Lambda invocations (running total)", width=12, left=[
                cw.MathExpression(expression=f"RUNNING_SUM({name}_ok - {name}_err)", label=f"{name}: done", period=period,
                                  using_metrics={f"{name}_ok": fn.metric_invocations(period=period, statistic=cw.Stats.SUM),
                                                 f"{name}_err": fn.metric_errors(period=period, statistic=cw.Stats.SUM)})
                for name, fn in items.items()]),
            cw.GraphWidget(title="Map-run progress: item Lambdas in flight and failing", width=12, left=[
                *(fn.metric("ConcurrentExecutions", statistic=cw.Stats.MAXIMUM, period=period, label=f"{name}: in flight")
                  for name, fn in items.items()),
                *(fn.metric_errors(period=period, statistic=cw.Stats.SUM, label=f"{name}: failed attempts") for name, fn in items.items())]))
        dashboard.add_widgets(
            cw.GraphWidget(title="Rows scanned and written", width=8, left=[
                search("RowsScanned", "Sum", "SUM", "rows scanned"), search("RowsWritten", "Sum", "SUM", "rows written")]),
            cw.GraphWidget(title="Bytes written", width=8, left=[search("BytesWritten", "Sum", "SUM", "bytes written")]),
            cw.GraphWidget(title="Unit duration (s)", width=8, left=[
                search("UnitDuration", "Average", "AVG", "average"), search("UnitDuration", "Maximum", "MAX", "maximum")]))
        dashboard.add_widgets(
            per_function("Lambda errors", "Errors", cw.Stats.SUM), per_function("Lambda throttles", "Throttles", cw.Stats.SUM),
            per_function("Lambda duration p95 (ms)", "Duration", cw.Stats.percentile(95)))
        dashboard.add_widgets(
            cw.GraphWidget(title="Follow-up work: rollup pieces queued, in flight and failed", width=12, left=[
                self.rollup_work.metric_approximate_number_of_messages_visible(period=period, label="RollupWork: waiting"),
                self.rollup_work.metric_approximate_number_of_messages_not_visible(period=period, label="RollupWork: in flight"),
                self.rollup_failures.metric_approximate_number_of_messages_visible(period=period, label="RollupFailures"),
                self.rollup_dead_letters.metric_approximate_number_of_messages_visible(period=period, label="RollupDeadLetters")]),
            cw.AlarmWidget(title="Follow-up work: age of the oldest waiting piece (s)", width=12, alarm=self.rollup_work_age_alarm))
        return dashboard

    def _map_run_widget(self, label: str, name: str, period: Duration) -> cw.GraphWidget:
        """One Distributed Map's items: its child executions report the execution metrics under the
        dimension ``StateMachineArn = <state machine ARN>/<Label>`` (one child per item, no batching).
        Left, running totals over the graph's time range; right, per period, the items that ended
        badly (after the item task's retries, which the item Lambda's errors on the next row show)."""
        dimensions = {"StateMachineArn": f"{self.state_machine.state_machine_arn}/{label}"}

        def child(metric: str, label_text: str) -> cw.Metric:
            return cw.Metric(namespace="AWS/States", metric_name=metric, dimensions_map=dimensions, statistic=cw.Stats.SUM,
                             period=period, label=label_text)

        key = label.lower()
        return cw.GraphWidget(
            title=f"Map-run progress: {label} ({name} Lambda, one child execution per item)", width=8,
            left=[cw.MathExpression(expression=f"RUNNING_SUM({key}_{event})", label=f"items {text} (running total)", period=period,
                                    using_metrics={f"{key}_{event}": child(metric, text)})
                  for event, metric, text in (("started", "ExecutionsStarted", "started"), ("done", "ExecutionsSucceeded", "done"))],
            right=[child("ExecutionsFailed", "items failed"), child("ExecutionsTimedOut", "items timed out"),
                   child("ExecutionsAborted", "items aborted")])


_ATTRIBUTE_TYPES = {"S": "STRING", "N": "NUMBER", "B": "BINARY"}


def distributed_maps(asl_path: Path = ASL) -> dict[str, str]:
    """Each Distributed Map of the workflow, by its ``Label``, with the function its item task runs
    (``{"ScanSource": "scan", ...}``), so the dashboard follows the workflow file. A Map Run's child
    executions report their metrics under ``<state machine ARN>/<Label>``; without a label that is a
    per-run UUID no dashboard can name, so an unlabelled Distributed Map is refused."""
    functions = {f"${{{_pascal(name)}FunctionArn}}": name for name in WORKFLOW_FUNCTIONS}
    found: dict[str, str] = {}

    def walk(states: dict[str, Any]) -> None:
        for state_name, state in states.items():
            for branch in state.get("Branches", []):
                walk(branch["States"])
            processor = state.get("ItemProcessor")
            if processor is None:
                continue
            walk(processor["States"])
            if processor.get("ProcessorConfig", {}).get("Mode") != "DISTRIBUTED":
                continue
            if not state.get("Label"):
                raise ValueError(f"{asl_path.name}: Distributed Map '{state_name}' has no Label, so its items' metrics have no fixed name")
            names = {functions[task["Parameters"]["FunctionName"]] for task in processor["States"].values()
                     if task.get("Parameters", {}).get("FunctionName") in functions}
            if len(names) != 1:
                raise ValueError(f"{asl_path.name}: Distributed Map '{state_name}' runs {sorted(names) or 'no'} functions, expected one")
            found[state["Label"]] = names.pop()

    walk(json.loads(asl_path.read_text())["States"])
    return found


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _job_schema() -> apigw.JsonSchema:
    """The job model's object shape and required fields, from `timelake.JobSpec` itself so the
    API and the engine agree. Field types stay with the handler's pydantic validation: API
    Gateway speaks JSON Schema draft 4 and would answer a mistake with a bare 400."""
    return apigw.JsonSchema(schema=apigw.JsonSchemaVersion.DRAFT4, title="Job", type=apigw.JsonSchemaType.OBJECT,
                            required=JobSpec.model_json_schema().get("required", []))
