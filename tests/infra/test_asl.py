"""The workflow definition passes the States Language validator (npm asl-validator)."""

from __future__ import annotations

import os
import subprocess

from infra.layer import REPO
from infra.stack import ASL


def test_workflow_definition_is_valid_asl() -> None:
    run = subprocess.run(["npx", "--yes", "asl-validator", "--json-path", str(ASL.relative_to(REPO))], cwd=REPO,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"})
    assert run.returncode == 0, run.stdout + run.stderr
