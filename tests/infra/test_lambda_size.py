"""The real layers, built by the stack's own local bundler (pip from PyPI; cached in build/).

Lambda refuses a function whose code plus layers exceed 250 MB unzipped, and we keep every
function under 200 MiB to leave room to grow. The dependencies are pruned hard and split into layers
(engine, DuckDB, PostgreSQL driver) so each function carries only what it can import; these tests
measure each function of the synthesized template with its own layers (built for Lambda), and check
the pruning and the split broke nothing: every object is aarch64, finds the libraries it links
against and has segments the loader can map, and (on a twin of the layers built for this machine,
pruned and stripped the same way) every handler imports and uses its layers through the engine's
own code with nothing else on its path (`lambda_probe.py`).
"""

from __future__ import annotations

import ast
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aws_cdk import BundlingOptions, DockerImage

from infra.layer import BUILD, DROPPED, ENGINE, ENGINE_LAYER, LAYERS, EngineBundler, _image, build_deps, bundle, host_target
from infra.stack import FUNCTIONS, FUNCTIONS_DIR, LAYER_DESCRIPTIONS
from tests.aws_fixtures import aws, moto_server  # noqa: F401
from tests.infra.conftest import Synthesized, synthesized  # noqa: F401
from tests.sources.conftest import postgres  # noqa: F401
from timelake.ports.runtime import LakeConfig

pytestmark = pytest.mark.slow

LIMIT = 262_144_000  # bytes: Lambda's "250 MB unzipped" for a function and all its layers
HEADROOM = 209_715_200  # bytes (200 MiB): what every function must stay under, room for growth
EM_AARCH64 = 183
LAMBDA_SYSTEM_LIBRARIES = {  # glibc and the GCC runtime of the python3.12 (Amazon Linux 2023) image
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "ld-linux-aarch64.so.1",
    "libstdc++.so.6", "libgcc_s.so.1",
}
# The AWS SDK for Python and its dependencies, which the Lambda Python runtime provides (/var/runtime).
LAMBDA_RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")
LAZY_IMPORTS = (  # loaded at run time, not when a handler module is imported
    "pyiceberg.catalog.glue", "pyiceberg.io.pyarrow", "pyiceberg.table.update.snapshot", "pyarrow.dataset",
    "pyarrow.parquet", "pyarrow.csv", "pyarrow.json", "pyarrow.ipc", "pyarrow.compute", "duckdb", "aws_xray_sdk",
    "timelake.aws.store", "timelake.aws.events", "timelake.interfaces.orchestrator",
    "adbc_driver_manager.dbapi", "adbc_driver_postgresql.dbapi",
)
PROBE = Path(__file__).with_name("lambda_probe.py")


@dataclass(frozen=True)
class Deployed:
    """A function of the synthesized template: its name (its folder under functions/) and its layers."""

    name: str
    layers: tuple[str, ...]


def deployed(synth: Synthesized) -> list[Deployed]:
    """Every AWS::Lambda::Function of the template, named as `BackfillStack._function` describes it."""
    layer_names = {logical: next(name for name, text in LAYER_DESCRIPTIONS.items() if text == r["Properties"]["Description"])
                   for logical, r in synth.resources("AWS::Lambda::LayerVersion").items()}
    functions = []
    for logical, resource in synth.resources("AWS::Lambda::Function").items():
        name = resource["Properties"]["Description"].removeprefix("timelake backfill: ").replace(" ", "_")
        assert (FUNCTIONS_DIR / name / "app.py").is_file(), f"{logical}: no functions/{name}/app.py"
        layers = sorted((layer_names[ref["Ref"]] for ref in resource["Properties"].get("Layers", [])), key=LAYERS.index)
        functions.append(Deployed(name, tuple(layers)))
    return functions


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
    """Bytes unzipped, as Lambda counts them: the asset zip stores a linked file as a full copy."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def test_each_deployed_function_with_its_layers_is_at_most_200_mib(layers: dict[str, Path], synthesized: Synthesized) -> None:  # noqa: F811
    functions = deployed(synthesized)
    assert sorted(f.name for f in functions) == sorted(FUNCTIONS)
    assert all(sorted(f.layers) == sorted(FUNCTIONS[f.name].layers()) for f in functions)
    layer_bytes = {name: size(path) for name, path in layers.items()}
    stripped = (build_deps() / "stripped-with.txt").read_text().strip()
    rows = [f"{name + ' layer':<16}{layer_bytes[name] / 1e6:>9.1f} MB" for name in LAYERS]
    rows[0] += f" (shared objects stripped with {stripped})"
    totals = {}
    for function in functions:
        code = size(FUNCTIONS_DIR / function.name)
        totals[function.name] = code + sum(layer_bytes[layer] for layer in function.layers)
        rows.append(f"{function.name:<16}{code / 1e3:>9.1f} kB  + {' + '.join(function.layers):<26} = "
                    f"{totals[function.name] / 2**20:6.1f} MiB of {HEADROOM / 2**20:.0f} MiB")
    report = "\n".join(rows)
    print(report)
    BUILD.mkdir(exist_ok=True)
    (BUILD / "lambda-sizes.txt").write_text(report + "\n")
    assert all(total <= HEADROOM < LIMIT for total in totals.values()), report
    slim = [f.name for f in functions if "duckdb" not in f.layers]
    assert {"write", "cut", "stage", "publish", "abort", "api", "record_failure"} <= set(slim)
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
        assert _image(path.read_bytes()) is not None, f"{path.relative_to(layer)} has a segment the loader cannot map"


def test_layer_leaves_out_what_lambda_provides_or_never_loads(layer: Path) -> None:
    site = layer / "python"
    assert (site / "timelake" / "__init__.py").exists() and (site / "pyarrow").is_dir() and (site / "aws_xray_sdk").is_dir()
    kept = {info.name.split("-", 1)[0].lower().replace("_", "-") for info in site.glob("*.dist-info")}
    assert not kept & set(DROPPED), kept & set(DROPPED)
    assert (site / "requests").is_dir() and not list((site / "charset_normalizer").glob("*.so"))  # pyiceberg's REST client
    for path in ("boto3", "botocore", "urllib3", "pandas", "typer", "rich", "sqlalchemy", "fsspec", "pyiceberg_core",
                 "pyarrow/include", "pyarrow/tests", "pyarrow/libarrow_flight.so.2600", "numpy/random", "duckdb/experimental"):
        assert not (site / path).exists(), path
    assert not list(site.rglob("__pycache__")), "compiled for the build machine's Python, useless on Lambda"
    assert not [p for p in (site / "timelake").rglob("*") if p.suffix in (".c", ".h", ".so")], \
        "the engine's compiled parts are built for this machine, not Lambda's aarch64; their sources serve no import"
    assert not [p for p in site.rglob("*") if p.is_symlink()], "the asset zip would store each link as a copy"


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


@pytest.fixture(scope="module")
def lambda_paths(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple[str, ...]], list[Path]]:
    """``sys.path`` of a function with these layers, as on Lambda: the layers merged into one
    ``python/`` folder (built for this machine), then the runtime's packages. One folder per set of
    layers, shared by the functions that have it: the bytecode the first probe writes there spares
    the next ones recompiling pyarrow, pyiceberg and pydantic."""
    runtime = tmp_path_factory.mktemp("var-runtime")
    venv_site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    for package in LAMBDA_RUNTIME_PACKAGES:
        for candidate in (venv_site / package, venv_site / f"{package}.py"):
            if candidate.exists():
                (runtime / candidate.name).symlink_to(candidate)
    sites: dict[tuple[str, ...], Path] = {}

    def paths(layers: tuple[str, ...]) -> list[Path]:
        if layers not in sites:
            sites[layers] = tmp_path_factory.mktemp("opt") / "python"
            for layer in layers:
                bundle(sites[layers].parent, layer, deps=build_deps(host_target()))
        return [sites[layers], runtime]

    return paths


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_handler_works_with_only_its_layers(name: str, aws: str, tmp_path: Path, request: pytest.FixtureRequest,  # noqa: F811
                                            lambda_paths: Callable[[tuple[str, ...]], list[Path]]) -> None:
    """`lambda_probe.py` in a fresh ``python -I -S``: the handler's folder, its layers (a twin built for
    this machine, pruned, stripped and split the same way) and the Lambda runtime's packages are all
    it has. It uses each layer through the engine (S3, Glue, swap; DuckDB and line-protocol sources;
    the PostgreSQL driver against a real server), and finds the layers it does not get absent."""
    layers = FUNCTIONS[name].layers()
    jobs = "timelake-jobs"
    config = LakeConfig(catalog_name="glue", catalog_props={"type": "glue", "warehouse": "s3://lake/warehouse", "glue.endpoint": aws,
                                                            "glue.region": "us-east-1", "s3.endpoint": aws, "s3.region": "us-east-1"},
                        store=f"dynamodb://{jobs}", staging="s3://lake/_backfill")
    settings = {"function": name, "code": str(FUNCTIONS_DIR / name), "paths": [str(p) for p in lambda_paths(layers)],
                "layers": list(layers), "endpoint": aws, "jobs_table": jobs,
                "lazy_imports": [m for m in LAZY_IMPORTS if m != "duckdb" and not m.startswith("adbc")],
                "postgres": request.getfixturevalue("postgres").uri() if "postgres" in layers else None}
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": aws, "TIMELAKE_S3_ENDPOINT": aws, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "TIMELAKE_CONFIG": config.model_dump_json(), "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:probe",
           "POWERTOOLS_SERVICE_NAME": "timelake-backfill", "POWERTOOLS_TRACE_DISABLED": "true"}
    run = subprocess.run([sys.executable, "-I", "-S", str(PROBE), str(tmp_path / "settings.json")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert run.stdout.strip().splitlines()[-1] == "ok", run.stdout[-3000:]
