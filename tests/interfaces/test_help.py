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


def _commands(command, path=()):
    """Every command of the CLI with the words that run it."""
    subcommands = getattr(command, "commands", {})
    if not subcommands:
        yield path, command
    for name, sub in subcommands.items():
        yield from _commands(sub, (*path, name))


def test_every_help_reads_whole_at_80_columns():
    """A narrow terminal wraps descriptions; it never cuts an option's name or a line."""
    from typer.testing import CliRunner

    from timelake.interfaces.cli import app

    runner = CliRunner()
    seen = 0
    for path, command in _commands(typer.main.get_command(app)):
        words = [w for w in path if w not in ("run", "show")] if path[:1] in (("backfill",), ("coverage",)) else list(path)
        text = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}).output
        options = [opt for param in command.params for opt in getattr(param, "opts", []) if opt.startswith("--")]
        cut = [opt for opt in options if opt not in text]
        assert not cut, f"timelake {' '.join(words)} --help at 80 columns cuts {cut}"
        wide = [line for line in text.splitlines() if len(line) > 80]
        assert not wide, f"timelake {' '.join(words)} --help: a line of {len(wide[0])} columns: {wide[0]!r}"
        seen += 1
    assert seen > 15
