"""One place per fact: the job fields are described in `JobSpec`; the JSON schema file, the docs' field
table and the CLI's option help are generated from it and must not drift."""

from __future__ import annotations

import json

import typer
from rich.text import Text
from typer.testing import CliRunner

from timelake.interfaces import reference
from timelake.interfaces.cli import app, field_help, field_of
from timelake.model.spec import JobSpec

HINT = "run: PYTHONPATH=layers python -m timelake.interfaces.reference"


def _commands(group=None, path=()):
    group = group or typer.main.get_command(app)
    for name, command in getattr(group, "commands", {}).items():
        yield (*path, name), command
        yield from _commands(command, (*path, name))


def test_every_field_is_described_once_in_the_model():
    missing = [name for name, info in JobSpec.model_fields.items() if not (info.description or "").strip()]
    assert missing == []


def test_committed_schema_is_the_model():
    assert (reference.DOCS / "job.schema.json").read_text() == reference.job_schema(), HINT
    assert json.loads(reference.job_schema()) == JobSpec.model_json_schema()


def test_docs_field_table_is_the_model():
    page = (reference.DOCS / "job-json.md").read_text()
    assert reference.job_json_page(page) == page, HINT
    for name, info in JobSpec.model_fields.items():
        assert f"| `{name}` |" in page and reference._cell(info.description) in page


def test_every_field_has_a_cli_option_whose_help_is_its_description():
    run = dict(_commands())[("backfill", "run")]
    fields = {field_of(p.name): p for p in run.params if field_of(p.name)}
    assert set(JobSpec.model_fields) - set(fields) == {"job_id"}
    for field, param in fields.items():
        assert param.help == field_help(field)
        assert Text.from_markup(param.help).plain == JobSpec.model_fields[field].description


def test_rich_markup_eats_no_bracket_of_any_help():
    """Typer renders help as Rich markup: an unescaped ``[for PT10M]`` would vanish from the help."""
    for path, command in _commands():
        for param in command.params:
            if getattr(param, "help", None):
                assert Text.from_markup(param.help).plain == param.help.replace("\\[", "["), (path, param.name)
    shown = CliRunner().invoke(app, ["table", "declare", "--help"], env={"COLUMNS": "250"}).output
    assert "[for PT10M] [severity S]" in shown
