"""CDK entry point (``cdk.json`` runs it): the backfill stack, checked by cdk-nag on every synth.

Tests build the same app through `build_app`, passing the feature flags of ``cdk.json`` as
context because ``cdk.App()`` outside the CLI does not read that file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script by the CDK CLI

from aws_cdk import App, Environment, Validations  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from infra.layer import REPO  # noqa: E402
from infra.nag import acknowledge  # noqa: E402
from infra.stack import BackfillStack, Settings  # noqa: E402

STACK_NAME = "TimelakeBackfill"


def feature_flags() -> dict[str, Any]:
    """The context of ``cdk.json``: the feature flags the stack is written and tested against."""
    return json.loads((REPO / "cdk.json").read_text())["context"]


def build_app(context: dict[str, Any] | None = None, **stack_kwargs: Any) -> tuple[App, BackfillStack]:
    """The app with the stack and the AWS Solutions checks; an unacknowledged finding makes
    synth raise. The deployer's choices come from CDK context (`Settings.from_context`:
    glueDatabases, sourceBuckets, alarmEmail, alarmTopicArn, scanConcurrency, writeConcurrency,
    unitTtlDays, rollupWorkMaxAgeHours); ``cdk deploy -c key=value`` or cdk.json."""
    app = App(context=context)
    stack_kwargs.setdefault("settings", Settings.from_context(app.node.try_get_context))
    stack = BackfillStack(app, STACK_NAME, description="timelake backfill: load history into live Iceberg tables",
                          env=Environment(account=app.node.try_get_context("account"), region=app.node.try_get_context("region")),
                          **stack_kwargs)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    acknowledge(stack)
    return app, stack


if __name__ == "__main__":
    build_app()[0].synth()
