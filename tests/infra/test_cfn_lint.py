"""cfn-lint, the executable, on the synthesized template."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import Synthesized

CFN_LINT = Path(sys.executable).parent / "cfn-lint"
IGNORED = {
    # CDK gives each function DependsOn its role and the role's policy, so the policy exists
    # before the function can run; the role part duplicates the GetAtt and cfn-lint says so.
    "W3005": "redundant DependsOn emitted by CDK",
}


def test_cfn_lint_passes(synthesized: Synthesized) -> None:
    run = subprocess.run([str(CFN_LINT), "--format", "json", "--ignore-checks", *IGNORED, "--", str(synthesized.template_path)],
                         capture_output=True, text=True)
    findings = json.loads(run.stdout or "[]")
    unexpected = [f"{f['Rule']['Id']} {'/'.join(map(str, f['Location']['Path']))}: {f['Message']}" for f in findings]
    assert not unexpected, "\n".join(unexpected)
    assert run.returncode == 0 or findings, run.stderr
