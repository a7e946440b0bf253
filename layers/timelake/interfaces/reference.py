"""The job model's reference, generated: the JSON schema file and the docs' field table.

The fields are described once, in `JobSpec`; the CLI options take their help from it (`cli.field_help`),
and this module writes `docs/job.schema.json` and the table in `docs/job-json.md` from it. A test
compares the committed files with this output, so run ``python -m timelake.interfaces.reference`` after
changing a field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from pydantic_core import PydanticUndefined

from timelake.interfaces.cli import app, field_of
from timelake.model.spec import JobSpec

START, END = "<!-- fields:start -->", "<!-- fields:end -->"
DOCS = Path(__file__).resolve().parents[3] / "docs"


def job_schema() -> str:
    """The text of docs/job.schema.json (what `timelake backfill schema` prints, indented)."""
    return json.dumps(JobSpec.model_json_schema(), indent=2) + "\n"


def cli_flags() -> dict[str, str]:
    """Job field → the option (or argument) of `timelake backfill TABLE …` that sets it."""
    run = typer.main.get_command(app).commands["backfill"].commands["run"]  # type: ignore[attr-defined]
    flags = {}
    for param in run.params:
        field = field_of(param.name)
        if field is not None:
            flags[field] = param.opts[0] if param.param_type_name == "option" else param.name.upper()
    return flags


def fields_table() -> str:
    """The Markdown table of the job fields: field, type, default, CLI flag, description."""
    schema = JobSpec.model_json_schema()
    flags = cli_flags()
    lines = ["| field | type | default | CLI | description |", "|---|---|---|---|---|"]
    for name, info in JobSpec.model_fields.items():
        prop = schema["properties"][name]
        cells = [f"`{name}`", _type(prop, schema.get("$defs", {})), _default(info),
                 f"`{flags[name]}`" if name in flags else "", info.description or ""]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def job_json_page(text: str) -> str:
    """``text`` (docs/job-json.md) with the part between the field markers replaced by the generated table."""
    head, found, rest = text.partition(START)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"docs/job-json.md lacks the markers {START} … {END}")
    return f"{head}{START}\n\n{fields_table()}\n\n{END}{tail}"


def write(docs: Path = DOCS) -> list[Path]:
    """Regenerate the schema file and the docs table; return the files that changed."""
    page = docs / "job-json.md"
    changed = []
    for path, text in ((docs / "job.schema.json", job_schema()), (page, job_json_page(page.read_text()))):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def _cell(text: str) -> str:
    """Markdown-safe: a pipe would end the cell and ``<UTC date>`` would be read as an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    return " or ".join(_one_type(defs.get(p.get("$ref", "").rsplit("/", 1)[-1], p)) for p in options)


def _one_type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(map(str, prop["enum"]))
    kind = prop.get("format", prop.get("type", "any"))
    if kind == "array":
        return f"list of {_one_type(prop.get('items', {}))}"
    if kind == "object":
        return f"object of {_one_type(prop.get('additionalProperties', {}))}"
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None:
        kind += f" ≥ {low:,}" if high is None else f" {low:,}–{high:,}"
    return kind


def _default(info: Any) -> str:
    if info.default is not PydanticUndefined:
        return "" if info.default is None else f"`{json.dumps(info.default)}`"
    if info.default_factory is not None:
        value = info.default_factory()
        return f"`{json.dumps(value)}`" if isinstance(value, list | dict) else "generated"
    return "required"


if __name__ == "__main__":
    for changed in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS):
        print(f"wrote {changed}")
