"""cdk-nag (AWS Solutions pack) runs on every synth; every finding is fixed or acknowledged with a reason."""

from __future__ import annotations

import pytest
from aws_cdk import aws_iam as iam

from infra.app import build_app, feature_flags

from .conftest import NO_BUNDLING, Synthesized


def aws_solutions(synthesized: Synthesized) -> dict:
    (report,) = [r for r in synthesized.validation["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    return report


def test_no_unacknowledged_findings(synthesized: Synthesized) -> None:
    report = aws_solutions(synthesized)
    assert report["violations"] == [] and report["conclusion"] == "success"
    assert report["suppressedViolations"], "the pack reported nothing at all: is it still attached to the app?"


def test_every_acknowledgment_says_why(synthesized: Synthesized) -> None:
    for finding in aws_solutions(synthesized)["suppressedViolations"]:
        assert len(finding["reason"]) >= 80, (finding["acknowledgedId"], finding["reason"])


def test_acknowledgments_are_specific_so_a_new_wildcard_fails_synth() -> None:
    app, stack = build_app({**feature_flags(), **NO_BUNDLING})
    stack.functions["write"].add_to_role_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=["arn:aws:s3:::elsewhere/*"]))
    with pytest.raises(Exception, match=r"AwsSolutions-IAM5\[Resource::arn:aws:s3:::elsewhere/\*\]"):
        app.synth()
