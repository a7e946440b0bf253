"""The engine's imports run one way and form no circle, so the folders keep reading as the architecture.

interfaces → runner → steps → (sources, followup) → model → ports → errors. The adapters
(`timelake.adapters`, `timelake.aws`) implement the ports and are picked in one composition root;
only the runner and the interfaces may import them. Every import counts, also one inside a function
or under ``TYPE_CHECKING``: a lazy import is how a circle usually hides. The ports hold interfaces,
configuration and pure helpers, never an implementation: that would be an adapter the composition
root does not pick.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "layers" / "timelake"

# A part may import its own modules and any part of a lower rank. Parts of one rank do not import
# each other.
RANKS = {"": 7, "duckdb": 7, "interfaces": 6, "runner": 5, "steps": 4, "sources": 3, "followup": 3, "model": 2,
         "ports": 1, "workers": 1, "memory": 1, "errors": 0}
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


# What a class in a port module may derive from: an interface, or a value (configuration, records).
PORT_BASES = {"typing.Protocol", "typing.Generic", "typing.TypedDict", "pydantic.BaseModel", "enum.Enum", "enum.IntEnum",
              "enum.StrEnum"}  # interfaces, configuration and records (a TypedDict is the shape of one)
# Calls that make what only an adapter makes: a catalog, a file system, a FileIO, an AWS client, a database connection.
ADAPTER_CALLS = {"pyiceberg.catalog.load_catalog", "pyiceberg.io.load_file_io", "pyarrow.fs.resolve_s3_region",
                 "sqlite3.connect", "duckdb.connect"}


def builds_an_adapter(call: str) -> bool:
    """Whether ``call`` (a resolved dotted name) constructs a concrete file system, catalog, FileIO,
    AWS client or database connection."""
    leaf = call.rpartition(".")[2]
    return (call in ADAPTER_CALLS or call.split(".")[0] in ("boto3", "botocore")
            or (call.startswith("pyarrow.fs.") and (leaf.endswith("FileSystem") or leaf == "from_uri"))
            or (call.startswith("pyiceberg.") and leaf.endswith(("Catalog", "FileIO"))))


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a name or an attribute chain on a name (``X[T]`` reads as ``X``); None for anything else."""
    if isinstance(node, ast.Subscript):
        return dotted(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def protocols(tree: ast.Module) -> dict[str, set[str]]:
    """The `typing.Protocol` classes of a module and the methods each asks for."""
    aliases = imported_names(tree)
    return {node.name: {f.name for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and "typing.Protocol" in {resolve(dotted(b) or "", aliases) for b in node.bases}}


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Each name a module's imports bind (anywhere in it) -> the dotted name it stands for."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def resolve(name: str, aliases: dict[str, str]) -> str:
    head, _, rest = name.partition(".")
    return ".".join(filter(None, [aliases.get(head, head), rest]))


def adapters_in(source: str, ports: dict[str, set[str]]) -> list[str]:
    """What makes a port module hold an adapter: a class that derives from anything but an interface or
    a value (pyiceberg's FileIO, a pyarrow file system), a class that has every method of a port
    (``ports``: port name -> methods; the module's own protocols count too), and a call that constructs
    a concrete file system, catalog, FileIO, client or connection."""
    tree = ast.parse(source)
    aliases = imported_names(tree)
    wanted = {**ports, **protocols(tree)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {resolve(dotted(b) or "?", aliases) for b in node.bases}
            if bases - PORT_BASES:
                found.append(f"class {node.name} derives from {', '.join(sorted(bases - PORT_BASES))}")
            if "typing.Protocol" not in bases:
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                found += [f"class {node.name} implements the port {port}" for port, asks in sorted(wanted.items())
                          if asks and asks <= methods]
        elif isinstance(node, ast.Call) and (name := dotted(node.func)) and builds_an_adapter(resolve(name, aliases)):
            found.append(f"line {node.lineno} calls {resolve(name, aliases)}")
    return found


def port_protocols() -> dict[str, set[str]]:
    return {name: methods for path in sorted((ENGINE / "ports").glob("*.py"))
            for name, methods in protocols(ast.parse(path.read_text())).items()}


def test_ports_hold_no_adapter() -> None:
    """Every implementation is an adapter, which the composition root (`timelake.adapters.compose`) picks:
    the ports hold interfaces (`typing.Protocol`), configuration, records and pure helpers only."""
    ports = port_protocols()
    found = {path.name: adapters_in(path.read_text(), ports) for path in sorted((ENGINE / "ports").glob("*.py"))}
    assert not any(found.values()), "adapters in timelake.ports:\n" + "\n".join(
        f"{name}: {finding}" for name, findings in found.items() for finding in findings)
    assert {"Clock", "ObjectIO", "JobStore", "EventBus", "AlarmSink"} <= set(ports)  # the ports the check compares with


def test_the_adapter_check_finds_what_the_ports_once_held() -> None:
    """The object IO, the catalog and the clock that the ports held before the composition root picked them."""
    ports = port_protocols()
    shared_io = "from pyiceberg.io.pyarrow import PyArrowFileIO\nclass SharedFileIO(PyArrowFileIO):\n    pass\n"
    s3 = "import pyarrow.fs as pafs\ndef _s3(bucket):\n    return pafs.S3FileSystem(region=pafs.resolve_s3_region(bucket))\n"
    local = "from pyarrow import fs\ndef local(uri):\n    return fs.LocalFileSystem(), uri\n"
    catalog = "from pyiceberg.catalog import load_catalog\nclass Runtime:\n    def catalog(self):\n        return load_catalog('x')\n"
    clock = ("import time\nclass SystemClock:\n    def now(self): return time.time()\n    def sleep(self, s): time.sleep(s)\n"
             "    def wait_until(self, instant, poll): pass\n    def workflow_instant(self, instant): return instant\n")
    clients = "import boto3, sqlite3\ndef make():\n    return boto3.client('s3'), sqlite3.connect('x.db')\n"
    assert adapters_in(shared_io, ports) == ["class SharedFileIO derives from pyiceberg.io.pyarrow.PyArrowFileIO"]
    assert adapters_in(s3, ports) == ["line 3 calls pyarrow.fs.S3FileSystem", "line 3 calls pyarrow.fs.resolve_s3_region"]
    assert adapters_in(local, ports) == ["line 3 calls pyarrow.fs.LocalFileSystem"]
    assert adapters_in(catalog, ports) == ["line 4 calls pyiceberg.catalog.load_catalog"]
    assert adapters_in(clock, ports) == ["class SystemClock implements the port Clock"]
    assert adapters_in(clients, ports) == ["line 3 calls boto3.client", "line 3 calls sqlite3.connect"]
    interface = ("from typing import Protocol\nimport pyarrow.fs as pafs\nclass Port(Protocol):\n"
                 "    def filesystem(self, uri) -> tuple[pafs.FileSystem, str]: ...\n")
    assert adapters_in(interface, ports) == []


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
