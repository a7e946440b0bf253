"""Every test the docs name as proof of a guarantee exists, so a renamed test cannot leave a claim unbacked."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?")


def named_tests() -> list[tuple[str, str, str | None]]:
    return [(page.name, *match.groups()) for page in sorted((ROOT / "docs").glob("*.md"))
            for match in REFERENCE.finditer(page.read_text())]


def test_every_test_the_docs_name_exists() -> None:
    found = named_tests()
    assert len(found) > 20, "the guarantees table names the tests behind each row"
    missing = []
    for page, path, name in found:
        file = ROOT / path
        if not file.is_file():
            missing.append(f"{page}: {path}")
        elif name and name not in {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}:
            missing.append(f"{page}: {path}::{name}")
    assert not missing, "docs name tests that do not exist:\n" + "\n".join(missing)
