"""The real engine layer, built by the stack's own local bundler (pip from PyPI; cached in build/).

Lambda refuses a function whose code plus layers exceed 250 MB unzipped, and the layer is pruned
hard to fit; these tests measure it and check the pruning broke nothing: every object is aarch64
and finds the libraries it links against, and (on a twin of the layer built for this machine,
pruned and stripped the same way) every handler imports and the native parts work.
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

from infra.layer import BUILD, DROPPED, ENGINE, EngineBundler, build_deps, host_target
from infra.stack import FUNCTIONS, FUNCTIONS_DIR

pytestmark = pytest.mark.slow

LIMIT = 262_144_000  # bytes: Lambda's "250 MB unzipped" for a function and all its layers
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
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("layer")
    assert EngineBundler().try_bundle(str(out), BundlingOptions(image=DockerImage.from_registry("unused")))
    return out


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


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


def test_each_function_with_its_layers_fits_the_lambda_limit(layer: Path) -> None:
    layer_bytes = size(layer)
    stripped = (build_deps() / "stripped-with.txt").read_text().strip()
    rows = [f"{'engine layer':<16}{layer_bytes / 1e6:>9.1f} MB (shared objects stripped with {stripped})"]
    for name in FUNCTIONS:
        code = size(FUNCTIONS_DIR / name)
        rows.append(f"{name:<16}{code / 1e3:>9.1f} kB  + layer = {(code + layer_bytes) / 1e6:.1f} MB of {LIMIT / 1e6:.1f} MB")
        assert code + layer_bytes < LIMIT, "\n".join(rows)
    report = "\n".join(rows)
    print(report)
    BUILD.mkdir(exist_ok=True)
    (BUILD / "lambda-sizes.txt").write_text(report + "\n")


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


def test_handlers_import_and_native_parts_work_on_a_twin_of_the_layer(tmp_path: Path) -> None:
    """Imports every handler with only the pruned, stripped dependencies (built for this machine)
    plus the packages of the Lambda runtime on the path, then uses each native library once."""
    runtime = tmp_path / "lambda-runtime"
    runtime.mkdir()
    venv_site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    for name in LAMBDA_RUNTIME_PACKAGES:
        for candidate in (venv_site / name, venv_site / f"{name}.py"):
            if candidate.exists():
                (runtime / candidate.name).symlink_to(candidate)
    paths = [str(build_deps(host_target()) / "python"), str(ENGINE.parent), str(runtime)]
    script = f"""
import importlib.util, sys
sys.path[:0] = {paths!r}
for name in {list(FUNCTIONS)!r}:
    spec = importlib.util.spec_from_file_location("handler_" + name, {str(FUNCTIONS_DIR)!r} + "/" + name + "/app.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
for name in {list(LAZY_IMPORTS)!r}:
    __import__(name)
import duckdb, pyarrow as pa, pyarrow.parquet as pq, pyroaring, zstandard, numpy
from pyarrow.fs import S3FileSystem
from pyiceberg.transforms import DayTransform
from pyiceberg.types import TimestampType
table = pa.table({{"x": numpy.arange(10)}})
pq.write_table(table, {str(tmp_path / "t.parquet")!r})
assert duckdb.sql("SELECT sum(x) AS s FROM read_parquet('{tmp_path / "t.parquet"}')").fetchall() == [(45,)]
assert zstandard.decompress(zstandard.compress(b"x" * 100)) == b"x" * 100 and len(pyroaring.BitMap([1, 2])) == 2
days = DayTransform().pyarrow_transform(TimestampType())(pa.array([86_400_000_000], pa.timestamp("us")))  # pyiceberg-core
assert days.to_pylist() == [1] and S3FileSystem
import adbc_driver_postgresql, pathlib
assert pathlib.Path(adbc_driver_postgresql._driver_path()).is_file()  # the driver library a connection loads
print("ok")
"""
    env = {"PATH": os.environ["PATH"], "AWS_DEFAULT_REGION": "us-east-1", "POWERTOOLS_SERVICE_NAME": "timelake-backfill",
           "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "ok", run.stdout
