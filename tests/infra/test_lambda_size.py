"""The real engine layer, built by the stack's own local bundler (pip from PyPI; cached in build/).

Lambda refuses a function whose code plus layers exceed 250 MB unzipped. The dependencies are
pruned hard and split into layers (engine, DuckDB, PostgreSQL driver) so each function carries only
what it can import; these tests measure each function with its own layers and check the pruning and
the split broke nothing: every object is aarch64 and finds the libraries it links against, and (on
a twin of the layers built for this machine, pruned and stripped the same way) every handler
imports and its native parts work with only its own layers.
"""

from __future__ import annotations

import ast
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import BundlingOptions, DockerImage

from infra.layer import BUILD, DROPPED, ENGINE, ENGINE_LAYER, LAYERS, EngineBundler, build_deps, bundle, host_target
from infra.stack import FUNCTIONS, FUNCTIONS_DIR

pytestmark = pytest.mark.slow

LIMIT = 262_144_000  # bytes: Lambda's "250 MB unzipped" for a function and all its layers
HEADROOM = 209_715_200  # bytes (200 MiB): what a function without DuckDB must stay under, room for growth
EM_AARCH64 = 183
LAMBDA_SYSTEM_LIBRARIES = {  # glibc and the GCC runtime of the python3.12 (Amazon Linux 2023) image
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "ld-linux-aarch64.so.1",
    "libstdc++.so.6", "libgcc_s.so.1",
}
LAMBDA_RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six")
LAZY_IMPORTS = (  # loaded at run time, not when a handler module is imported
    "pyiceberg.catalog.glue", "pyiceberg.io.pyarrow", "pyiceberg.table.update.snapshot", "pyarrow.dataset",
    "pyarrow.parquet", "pyarrow.csv", "pyarrow.json", "pyarrow.ipc", "pyarrow.compute", "duckdb", "aws_xray_sdk",
    "timelake.aws.store", "timelake.aws.events", "timelake.interfaces.orchestrator",
    "adbc_driver_manager.dbapi", "adbc_driver_postgresql.dbapi",
)


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each layer as the stack's bundler writes it."""
    out = {name: tmp_path_factory.mktemp(f"layer-{name}") for name in LAYERS}
    for name, path in out.items():
        assert EngineBundler(name).try_bundle(str(path), BundlingOptions(image=DockerImage.from_registry("unused")))
    return out


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All layers in one folder: what a function with every layer sees."""
    out = tmp_path_factory.mktemp("layer-all")
    for name in LAYERS:
        bundle(out, name)
    return out


def elf(path: Path) -> tuple[int, list[str]] | None:
    """(machine, DT_NEEDED names) of an ELF64 little-endian file, read from its section headers."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return None
    (machine,) = struct.unpack_from("<H", data, 0x12)
    (section_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    needed = []
    for _, kind, _, _, offset, length, link, *_ in sections:
        if kind == 6:  # SHT_DYNAMIC; its sh_link is the string table
            strings = sections[link][4]
            for entry in range(offset, offset + length, 16):
                tag, value = struct.unpack_from("<qQ", data, entry)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    start = strings + value
                    needed.append(data[start:data.index(b"\0", start)].decode())
    return machine, needed


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_each_function_with_its_layers_fits_the_lambda_limit(layers: dict[str, Path]) -> None:
    layer_bytes = {name: size(path) for name, path in layers.items()}
    stripped = (build_deps() / "stripped-with.txt").read_text().strip()
    rows = [f"{name + ' layer':<16}{layer_bytes[name] / 1e6:>9.1f} MB" for name in LAYERS]
    rows[0] += f" (shared objects stripped with {stripped})"
    totals = {}
    for name, spec in FUNCTIONS.items():
        code = size(FUNCTIONS_DIR / name)
        totals[name] = code + sum(layer_bytes[layer] for layer in spec.layers())
        rows.append(f"{name:<16}{code / 1e3:>9.1f} kB  + {' + '.join(spec.layers()):<26} = {totals[name] / 2**20:6.1f} MiB "
                    f"of {LIMIT / 2**20:.0f} MiB")
    report = "\n".join(rows)
    print(report)
    BUILD.mkdir(exist_ok=True)
    (BUILD / "lambda-sizes.txt").write_text(report + "\n")
    assert all(total < LIMIT for total in totals.values()), report
    slim = {name for name, spec in FUNCTIONS.items() if not spec.duckdb}
    assert {"write", "cut", "stage", "publish", "abort", "api", "record_failure"} <= slim
    assert all(totals[name] <= HEADROOM for name in slim), report
    assert all(totals[name] < totals["validate"] for name in slim), report  # the DuckDB layer is really left out


def test_layer_objects_are_aarch64_and_find_their_libraries(layer: Path) -> None:
    present = {p.name for p in layer.rglob("*") if p.is_file()}
    objects = [p for p in layer.rglob("*.so*") if p.is_file()]
    assert len(objects) > 20
    for path in objects:
        parsed = elf(path)
        assert parsed, f"{path} is not an ELF64 object"
        machine, needed = parsed
        assert machine == EM_AARCH64, f"{path.relative_to(layer)} is not aarch64 (e_machine {machine})"
        missing = set(needed) - present - LAMBDA_SYSTEM_LIBRARIES
        assert not missing, f"{path.relative_to(layer)} links against {sorted(missing)}, which the layer no longer has"


def test_layer_leaves_out_what_lambda_provides_or_never_loads(layer: Path) -> None:
    site = layer / "python"
    assert (site / "timelake" / "__init__.py").exists() and (site / "pyarrow").is_dir() and (site / "aws_xray_sdk").is_dir()
    kept = {info.name.split("-", 1)[0].lower().replace("_", "-") for info in site.glob("*.dist-info")}
    assert not kept & set(DROPPED), kept & set(DROPPED)
    for path in ("boto3", "botocore", "pandas", "typer", "rich", "sqlalchemy", "pyarrow/include", "pyarrow/tests",
                 "pyarrow/libarrow_flight.so.2600"):
        assert not (site / path).exists(), path
    assert not list(site.rglob("__pycache__")), "compiled for the build machine's Python, useless on Lambda"


def test_layers_split_the_dependencies_without_overlap(layers: dict[str, Path]) -> None:
    """DuckDB and the PostgreSQL driver live only in their own layers; together the layers hold
    exactly the dependency tree (nothing lost by the split, nothing shipped twice)."""
    tops = {name: {p.name for p in (path / "python").iterdir()} for name, path in layers.items()}
    assert {"duckdb", "_duckdb.abi3.so"} <= tops["duckdb"] and all(t.startswith(("duckdb", "_duckdb")) for t in tops["duckdb"])
    assert {"adbc_driver_manager", "adbc_driver_postgresql"} <= tops["postgres"]
    assert not tops[ENGINE_LAYER] & (tops["duckdb"] | tops["postgres"]) and not tops["duckdb"] & tops["postgres"]
    assert set().union(*tops.values()) == {p.name for p in (build_deps() / "python").iterdir()} | {"timelake"}


def imported_modules(path: Path) -> set[str]:
    """Absolute names a module imports (relative ones resolved), leaving out ``if TYPE_CHECKING:``."""
    package = ".".join(("timelake", *path.relative_to(ENGINE).parent.parts)) if path.is_relative_to(ENGINE) else ""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return names


def test_lambda_code_imports_only_what_the_layer_or_runtime_has(layer: Path) -> None:
    """Follows the handlers' imports through the engine: a top-level `import pandas` or `import
    typer` reachable from a handler would fail on Lambda, so it fails here."""
    site = layer / "python"
    available = {p.name.split(".")[0] for p in site.iterdir()} | set(LAMBDA_RUNTIME_PACKAGES) | set(sys.stdlib_module_names)
    seen: set[Path] = set()
    todo = [FUNCTIONS_DIR / name / "app.py" for name in FUNCTIONS]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top in available, f"{path.relative_to(ENGINE.parent.parent)} imports {name}, which a Lambda does not have"
            if top == "timelake":
                parts = name.split(".")[1:]
                for depth in range(len(parts) + 1):
                    module = ENGINE.joinpath(*parts[:depth])
                    todo += [p for p in (module / "__init__.py", module.with_suffix(".py")) if p.is_file()]


NATIVE_CHECKS = {  # one use of each layer's native libraries
    ENGINE_LAYER: """
import pyarrow as pa, pyarrow.parquet as pq, pyroaring, zstandard, numpy
from pyarrow.fs import S3FileSystem
from pyiceberg.transforms import DayTransform
from pyiceberg.types import TimestampType
pq.write_table(pa.table({"x": numpy.arange(10)}), TMP + "/t.parquet")
assert pq.read_table(TMP + "/t.parquet").column("x").to_pylist() == list(range(10))
assert zstandard.decompress(zstandard.compress(b"x" * 100)) == b"x" * 100 and len(pyroaring.BitMap([1, 2])) == 2
days = DayTransform().pyarrow_transform(TimestampType())(pa.array([86_400_000_000], pa.timestamp("us")))  # pyiceberg-core
assert days.to_pylist() == [1] and S3FileSystem
""",
    "duckdb": """
import duckdb
assert duckdb.sql("SELECT sum(x) AS s FROM read_parquet('" + TMP + "/t.parquet')").fetchall() == [(45,)]
""",
    "postgres": """
import adbc_driver_postgresql, adbc_driver_manager.dbapi, pathlib
assert pathlib.Path(adbc_driver_postgresql._driver_path()).is_file()  # the driver library a connection loads
""",
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_handler_imports_and_native_parts_work_with_only_its_layers(name: str, tmp_path: Path) -> None:
    """Imports the handler with only its own layers (a twin built for this machine, pruned, stripped
    and split the same way) plus the packages of the Lambda runtime on the path, uses each native
    library of those layers once, and finds the layers it does not get really missing."""
    layers = FUNCTIONS[name].layers()
    site = tmp_path / "layers"
    for layer in layers:
        bundle(site, layer, deps=build_deps(host_target()))
    runtime = tmp_path / "lambda-runtime"
    runtime.mkdir()
    venv_site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    for package in LAMBDA_RUNTIME_PACKAGES:
        for candidate in (venv_site / package, venv_site / f"{package}.py"):
            if candidate.exists():
                (runtime / candidate.name).symlink_to(candidate)
    absent = {"duckdb": "duckdb", "postgres": "adbc_driver_postgresql"}
    script = f"""
import importlib.util, sys
sys.path[:0] = {[str(site / "python"), str(runtime)]!r}
TMP = {str(tmp_path)!r}
spec = importlib.util.spec_from_file_location("handler", {str(FUNCTIONS_DIR / name / "app.py")!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
for module in {[m for m in LAZY_IMPORTS if m != "duckdb" and not m.startswith("adbc")]!r}:
    __import__(module)
""" + "".join(NATIVE_CHECKS[layer] for layer in layers) + "".join(f"""
try:
    import {module}
    raise SystemExit("{module} is importable without the {layer} layer")
except ImportError:
    pass
""" for layer, module in absent.items() if layer not in layers) + "print('ok')\n"
    env = {"PATH": os.environ["PATH"], "AWS_DEFAULT_REGION": "us-east-1", "POWERTOOLS_SERVICE_NAME": "timelake-backfill",
           "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "ok", run.stdout
