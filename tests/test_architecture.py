"""The engine's imports run one way and form no circle, so the folders keep reading as the architecture.

interfaces → runner → steps → (sources, followup) → model → ports → errors. The adapters
(`timelake.adapters`, `timelake.aws`) implement the ports and are picked in one composition root;
only the runner and the interfaces may import them. Every import counts, also one inside a function
or under ``TYPE_CHECKING``: a lazy import is how a circle usually hides.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "layers" / "timelake"

# A part may import its own modules and any part of a lower rank. Parts of one rank do not import
# each other.
RANKS = {"": 7, "duckdb": 7, "interfaces": 6, "runner": 5, "steps": 4, "sources": 3, "followup": 3, "model": 2,
         "ports": 1, "workers": 1, "errors": 0}
ADAPTERS = {"adapters", "aws"}
MAY_IMPORT_ADAPTERS = {"", "interfaces", "runner", *ADAPTERS}
ADAPTERS_MAY_IMPORT = {"ports", "errors", *ADAPTERS}


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ENGINE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The engine modules ``name`` imports, resolved to modules where a name is a submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def allowed(importer: str, imported: str) -> bool:
    src, dst = part(importer), part(imported)
    if src == dst:
        return True
    if dst in ADAPTERS:
        return src in MAY_IMPORT_ADAPTERS
    if src in ADAPTERS:
        return dst in ADAPTERS_MAY_IMPORT
    return RANKS[dst] < RANKS[src]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_known_part() -> None:
    unknown = sorted(name for name in modules() if part(name) not in RANKS and part(name) not in ADAPTERS)
    assert not unknown, f"modules outside the known parts (add them to a part): {unknown}"


def test_imports_run_one_way() -> None:
    wrong = sorted(f"{src} imports {dst}" for src, targets in graph().items() for dst in targets if not allowed(src, dst))
    assert not wrong, "imports against the direction:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    assert circles(graph()) == []


@pytest.mark.parametrize(("edges", "expected"), [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_circle_finder_finds_circles(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert circles(edges) == expected


def test_the_direction_check_refuses_upward_and_adapter_imports() -> None:
    assert not allowed("timelake.model.report", "timelake.steps.canary")
    assert not allowed("timelake.steps.write", "timelake.aws.store")
    assert not allowed("timelake.sources.base", "timelake.followup.rules")
    assert not allowed("timelake.aws.store", "timelake.steps.plan")
    assert allowed("timelake.runner", "timelake.adapters")
    assert allowed("timelake.steps.publish", "timelake.followup.completion")


def test_every_error_the_engine_raises_on_purpose_has_one_root_and_is_public():
    """One root, `BackfillError`, so a caller catches what the engine means in one clause; each exported
    from `timelake`."""
    import inspect

    import timelake
    from timelake import errors

    defined = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(defined) > 10 and all(issubclass(c, errors.BackfillError) for c in defined)
    assert {c.__name__ for c in defined} <= set(timelake.__all__)
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") and path.name != "errors.py":
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert not bases & {"ValueError", "Exception", "RuntimeError"}, f"{path.name}: {node.name} is not a BackfillError"
