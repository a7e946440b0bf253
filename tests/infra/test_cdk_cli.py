"""`cdk synth` with the real CLI from node_modules, as a deployer runs it: cdk.json, the app, the
feature flags, cdk-nag and the real layer bundling (reusing the cached dependencies)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from infra.app import STACK_NAME
from infra.layer import REPO


def test_cdk_synth_with_the_cli(tmp_path: Path) -> None:
    offline = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "CDK_DISABLE_VERSION_CHECK": "1", "CDK_DISABLE_CLI_TELEMETRY": "1"}
    run = subprocess.run(["npx", "--no-install", "cdk", "synth", "--quiet", "--no-notices", "--output", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=900, env={**os.environ, **offline})
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    template = json.loads((tmp_path / f"{STACK_NAME}.template.json").read_text())
    assert any(r["Type"] == "AWS::StepFunctions::StateMachine" for r in template["Resources"].values())
    assets = json.loads((tmp_path / f"{STACK_NAME}.assets.json").read_text())["files"]
    layer = [a for a in assets.values() if (tmp_path / a["source"]["path"] / "python" / "timelake" / "__init__.py").exists()]
    assert len(layer) == 1, "the engine layer was not bundled"
    assert (tmp_path / layer[0]["source"]["path"] / "python" / "pyarrow").is_dir()
