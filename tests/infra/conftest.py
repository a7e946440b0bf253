"""Shared synthesis for the infra tests.

A synth with cdk-nag costs ~20 s of CPU, so it runs once per test session: the first xdist
worker synthesizes under a file lock into the session's shared temp folder and the others read
the result. Bundling is skipped (``aws:cdk:bundling-stacks: []``); only the size test and the
CLI synth build the real layer.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from infra.app import STACK_NAME, build_app, feature_flags  # noqa: E402

NO_BUNDLING = {"aws:cdk:bundling-stacks": []}


@dataclass(frozen=True)
class Synthesized:
    template: dict[str, Any]
    validation: dict[str, Any]
    template_path: Path

    def resources(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: r for name, r in self.template["Resources"].items() if r["Type"] == kind}


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "infra-synth"
    with (shared / "infra-synth.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "done").exists():
            app, _ = build_app({**feature_flags(), **NO_BUNDLING})
            assembly = app.synth()  # raises on any unacknowledged cdk-nag finding
            out.mkdir(exist_ok=True)
            shutil.copy(Path(assembly.directory) / f"{STACK_NAME}.template.json", out / "template.json")
            shutil.copy(Path(assembly.directory) / "validation-report.json", out / "validation-report.json")
            (out / "done").touch()
    return Synthesized(json.loads((out / "template.json").read_text()),
                       json.loads((out / "validation-report.json").read_text()), out / "template.json")
