"""The examples in docs/ that are marked runnable run as written.

A block is runnable when the line right before its fence is ``<!-- run -->``. The marked blocks of
one page run in page order in a fresh temporary directory, which is also the working directory:
``python`` blocks in this process (the blocks of a page share their variables), ``bash`` blocks as a
bash script, ``console`` blocks as their ``$ `` lines. The virtualenv's ``timelake`` and ``python``
come first on PATH, and TIMELAKE_WAREHOUSE is ``./.timelake`` of the temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARK = "<!-- run -->"
FENCE = re.compile(r"^(`{3,})\s*([A-Za-z0-9_+-]*)")
LANGUAGES = {"python", "bash", "console"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str

    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def runnable_blocks(page: Path, mark: str = MARK) -> list[Block]:
    """The blocks of ``page`` marked with ``mark``, in order. A mark that is not followed by a fence of a
    known language is an error."""
    lines = page.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != mark:
            continue
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not fence or fence.group(2) not in LANGUAGES:
            raise AssertionError(f"docs/{page.name}:{i + 1}: {mark} must be followed by a ```python, ```bash or ```console fence")
        ticks, body = fence.group(1), []
        for j in range(i + 2, len(lines)):
            if lines[j].strip() == ticks:
                break
            body.append(lines[j])
        else:
            raise AssertionError(f"docs/{page.name}:{i + 2}: the fence is never closed")
        blocks.append(Block(page.name, i + 2, fence.group(2), "\n".join(body) + "\n"))
    return blocks


def console_script(code: str) -> str:
    """The commands of a console block: its ``$ `` lines and their backslash continuations."""
    commands, continued = [], False
    for line in code.splitlines():
        if continued:
            commands.append(line)
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            continue
        continued = line.rstrip().endswith("\\")
    return "\n".join(commands) + "\n"


PAGES = sorted(p for p in DOCS.glob("*.md") if runnable_blocks(p))


def test_the_docs_have_runnable_examples() -> None:
    """The convention is in use: the pages that teach the basics run their examples."""
    names = {p.name for p in PAGES}
    assert {"getting-started.md", "python-api.md", "cli.md", "sources.md"} <= names, names
    languages = {b.language for p in PAGES for b in runnable_blocks(p)}
    assert {"python", "bash"} <= languages


def test_a_mark_without_a_runnable_fence_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "bad.md"
    page.write_text(f"{MARK}\n```sql\nSELECT 1\n```\n")
    with pytest.raises(AssertionError, match="must be followed by"):
        runnable_blocks(page)


def test_console_blocks_run_their_prompt_lines_only() -> None:
    code = "$ timelake backfill list \\\n    --json\n[]\n$ echo done\ndone\n"
    assert console_script(code) == "timelake backfill list \\\n    --json\necho done\n"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_runnable_examples(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "timelake").exists(), f"the timelake console script is not installed in {bin_dir}"
    for name in [k for k in os.environ if k.startswith("TIMELAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TIMELAKE_WAREHOUSE", str(tmp_path / ".timelake"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in runnable_blocks(page):
        if block.language == "python":
            code = compile("\n" * block.line + block.code, f"docs/{block.page}", "exec")  # tracebacks name page lines
            exec(code, namespace)  # noqa: S102 - the docs' own examples
            continue
        script = block.code if block.language == "bash" else console_script(block.code)
        done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=tmp_path, env=os.environ.copy(),
                              capture_output=True, text=True, timeout=300)
        print(done.stdout)
        assert done.returncode == 0, f"{block.where()} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
