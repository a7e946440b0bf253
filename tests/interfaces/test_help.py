"""`timelake backfill --help` shows the main form, `TABLE --from SRC`, with every option described."""

from __future__ import annotations

import os
import subprocess

import typer.main

from tests.conftest import TIMELAKE
from timelake.interfaces.cli import backfill_app


def test_backfill_help_shows_the_main_form_with_every_option():
    env = {**os.environ, "COLUMNS": "250", "TERM": "dumb"}
    text = subprocess.run([TIMELAKE, "backfill", "--help"], capture_output=True, text=True, env=env, timeout=60,
                          check=True).stdout
    assert "Usage: timelake backfill [OPTIONS] {table}" in text and "resume" in text and "status" in text
    run = typer.main.get_command(backfill_app).commands["run"]
    options = [opt for param in run.params for opt in getattr(param, "opts", []) if opt.startswith("--")]
    assert len(options) > 20
    missing = [opt for opt in options if opt not in text]
    assert not missing, f"options missing from backfill --help: {missing}"
    undescribed = [p.opts[0] for p in run.params if getattr(p, "opts", None) and p.opts[0].startswith("--") and not p.help]
    assert not undescribed, f"options without a description: {undescribed}"
