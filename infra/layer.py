"""The engine layer, built without Docker.

Lambda allows 250 MB unzipped for a function and all its layers, and pyarrow + duckdb + numpy
alone come close to that, so the layer installs the engine's runtime dependencies as Linux
aarch64 / CPython 3.12 wheels with pip (no compiler, no container) and then removes what a
Lambda never loads. Every removal below names why it is safe; `tests/infra/test_lambda_size.py`
measures the real result and checks that no kept binary lost a library it links against.

pip downloads take about half a minute, so the pruned dependencies are cached under
``build/layer-deps-lambda-<hash>`` (hash of the requirements and of this file) and the engine package,
which changes often, is copied on top for each bundle.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "layers" / "timelake"
BUILD = REPO / "build"


@dataclass(frozen=True)
class Target:
    """Where the dependencies will run: Lambda, or this machine for tests that import the pruned tree."""

    name: str
    platforms: tuple[str, ...]
    python_version: str


LAMBDA = Target("lambda", ("manylinux_2_28_aarch64", "manylinux2014_aarch64"), "3.12")  # pyarrow 26: 2_28 wheels only


def host_target() -> Target:
    """The same dependencies, pruned and stripped the same way, for this machine's CPU and Python:
    the only way to import the pruned tree here, since Lambda's aarch64 objects cannot load."""
    arch = platform.machine()
    return Target(f"host-{arch}", (f"manylinux_2_28_{arch}", f"manylinux2014_{arch}"), f"{sys.version_info[0]}.{sys.version_info[1]}")


# Distributions the layer leaves out, even when another package depends on them.
DROPPED: dict[str, str] = {
    "boto3": "part of the Lambda Python runtime",
    "botocore": "part of the Lambda Python runtime",
    "s3transfer": "part of the Lambda Python runtime",
    "typer": "CLI only",
    "rich": "CLI only (pyiceberg imports it only in pyiceberg.cli)",
    "click": "CLI only (pyiceberg imports it only in pyiceberg.cli)",
    "pygments": "pulled in by rich",
    "markdown-it-py": "pulled in by rich",
    "mdurl": "pulled in by rich",
    "shellingham": "pulled in by typer",
    "pandas": "only for DataFrame input, which the engine imports lazily; Lambdas read files",
    "sqlalchemy": "pyiceberg's SQL catalog is the embedded default; Lambdas use Glue",
    "greenlet": "pulled in by sqlalchemy",
}
# Added to the layer unless the project lists them already.
EXTRA: dict[str, str] = {
    "numpy": "the engine imports numpy, which pyproject only gets through pandas, dropped above",
    "tzdata": "the Lambda base image does not promise /usr/share/zoneinfo; zoneinfo falls back to it",
}

# Paths (globs relative to the layer's python/ folder) that no Lambda imports.
PRUNED = (
    "bin",
    "**/__pycache__",
    "**/tests",
    "**/*.pyx", "**/*.pxd", "**/*.pxi", "**/*.pyi", "**/*.a",
    "_duckdb-stubs",
    "numpy/_core/include",
    "pyarrow/include", "pyarrow/src",
    # Arrow Flight, Substrait, ORC and the Azure/GCS/HDFS file systems: the engine reads Parquet,
    # CSV and JSON from S3 or local paths. pyarrow.fs and pyarrow.dataset import these inside
    # try/except ImportError; libarrow_substrait stays because pyarrow.lib links against it.
    "pyarrow/flight.py", "pyarrow/_flight.*.so", "pyarrow/libarrow_flight.so*", "pyarrow/libarrow_python_flight.so*",
    "pyarrow/substrait.py", "pyarrow/_substrait.*.so",
    "pyarrow/orc.py", "pyarrow/_orc.*.so", "pyarrow/_dataset_orc.*.so",
    "pyarrow/_azurefs.*.so", "pyarrow/_gcsfs.*.so", "pyarrow/_hdfs.*.so",
    "pyarrow/_pyarrow_cpp_tests.*.so",
    # Wheels cannot hold symlinks, so each versioned name is a full copy; the loader only asks
    # for the SONAME (``.so.2600``), the other two names serve C++ extension builds.
    "pyarrow/libarrow_python.so", "pyarrow/libarrow_python.so.*.*.*",
    "pyarrow/libarrow_python_parquet_encryption.so", "pyarrow/libarrow_python_parquet_encryption.so.*.*.*",
    # zstandard ships a C extension and a cffi backend of the same code; it loads the C one.
    "zstandard/_cffi.*.so", "zstandard/backend_cffi.py",
    # pyiceberg's Hive catalog client (thrift stubs).
    "hive_metastore", "fb303",
    # The C++ sources and headers the ADBC driver manager ships beside its compiled extension.
    "adbc_driver_manager/*.cc", "adbc_driver_manager/*.h", "adbc_driver_manager/*.hpp",
    "adbc_driver_manager/arrow-adbc", "adbc_driver_manager/toml++",
)

# Dependencies only some functions import, each shipped as its own layer (globs over the top of
# ``python/``): Lambda counts a function's code plus all its layers against 250 MB, and DuckDB alone
# is 63 MB. `infra.stack.FunctionSpec` says which function gets which.
OPTIONAL: dict[str, tuple[str, ...]] = {
    "duckdb": ("duckdb", "_duckdb*", "duckdb-*.dist-info"),  # validation SQL, rollups, DuckDB/line-protocol sources, dry-run overlap
    "postgres": ("adbc_driver_*",),  # the PostgreSQL source (ADBC driver manager + libpq driver)
}
ENGINE_LAYER = "engine"  # everything else, plus the timelake package
LAYERS = (ENGINE_LAYER, *OPTIONAL)


def requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The project's runtime dependencies minus those in ``DROPPED``, plus those in ``EXTRA``."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in deps if _name(d) not in DROPPED] + sorted(set(EXTRA) - {_name(d) for d in deps})


def deps_hash(target: Target = LAMBDA) -> str:
    """Changes when the requirements, the target or the way they are built and pruned change."""
    digest = hashlib.sha256("\n".join([*requirements(), repr(target)]).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def layer_hash(layer: str = ENGINE_LAYER) -> str:
    """The asset hash: the dependencies and the layer's name, plus every file of the engine package
    for the engine layer."""
    digest = hashlib.sha256(f"{deps_hash()}\0{layer}".encode())
    if layer == ENGINE_LAYER:
        for path in _engine_files():
            digest.update(str(path.relative_to(ENGINE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:32]


def build_deps(target: Target = LAMBDA, cache_root: Path = BUILD) -> Path:
    """The pruned dependency tree (a ``python/`` folder), built once per `deps_hash`.

    A file lock serializes parallel test workers and synths; the tree is built beside its final
    name and renamed into place, so a crash never leaves a half-built cache behind."""
    final = cache_root / f"layer-deps-{target.name}-{deps_hash(target)}"
    cache_root.mkdir(parents=True, exist_ok=True)
    with _locked(cache_root / "layer.lock"):
        if final.is_dir():
            return final
        partial = cache_root / f"{final.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        platforms = [arg for name in target.platforms for arg in ("--platform", name)]
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts", "--no-compile",
             "--target", str(partial / "python"), *platforms, "--implementation", "cp",
             "--python-version", target.python_version, "--only-binary=:all:", *requirements()],
            check=True,
        )
        prune(partial / "python")
        (partial / "stripped-with.txt").write_text(f"{strip_binaries(partial / 'python') or 'nothing: no strip for this CPU'}\n")
        partial.rename(final)
        for stale in cache_root.glob(f"layer-deps-{target.name}-*"):  # earlier requirements: ~250 MB each
            if stale != final:
                shutil.rmtree(stale, ignore_errors=True)
        return final


def prune(site: Path) -> None:
    """Removes the distributions in ``DROPPED`` (by their RECORD) and the paths in ``PRUNED``."""
    for info in site.glob("*.dist-info"):
        if _name(info.name.split("-", 1)[0]) in DROPPED:  # "<name>-<version>.dist-info", name without "-"
            for line in (info / "RECORD").read_text().splitlines():
                path = site / line.split(",", 1)[0]
                if path.resolve().is_relative_to(site.resolve()) and path.is_file():
                    path.unlink()
            shutil.rmtree(info)
    for pattern in PRUNED:
        for path in sorted(site.glob(pattern), reverse=True):
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for folder in sorted((p for p in site.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


def strip_binaries(site: Path) -> str | None:
    """Drops symbol tables and debug sections from shared objects (the loader maps neither):
    about 40 MB here, which the layer needs to fit. Returns the tool used, or None when no tool on
    this machine reads aarch64 objects (GNU strip for x86 does not), leaving the files as they are.

    Packages repaired with grafted libraries (a ``<name>.libs`` folder beside them) are left
    alone: auditwheel rewrote those objects with patchelf, stripping such objects is a known way
    to break them, and they gain little."""
    patched = {folder.name.removesuffix(".libs") for folder in site.glob("*.libs")}
    objects = [path for path in sorted(site.rglob("*.so*"))
               if path.is_file() and path.relative_to(site).parts[0].removesuffix(".libs") not in patched]
    tool = next((tool for tool in _strip_candidates() if objects and _strips(tool, objects[0])), None)
    if tool:
        for start in range(0, len(objects), 200):
            subprocess.run([tool, "--strip-unneeded", *map(str, objects[start:start + 200])], check=True)
    return tool


def layer_entries(site: Path, layer: str) -> list[Path]:
    """The top-level entries of the dependency tree ``site`` that belong to ``layer``."""
    optional = {path for patterns in OPTIONAL.values() for pattern in patterns for path in site.glob(pattern)}
    if layer == ENGINE_LAYER:
        return sorted(path for path in site.iterdir() if path not in optional)
    if layer not in OPTIONAL:
        raise ValueError(f"unknown layer {layer!r}; layers are {', '.join(LAYERS)}")
    return sorted(path for pattern in OPTIONAL[layer] for path in site.glob(pattern))


def bundle(output_dir: Path, layer: str = ENGINE_LAYER, deps: Path | None = None) -> None:
    """Writes ``layer`` into ``output_dir``: its part of the cached dependencies (plus, for the
    engine layer, the engine package). ``deps`` is a built tree (`build_deps`), by default Lambda's.

    Files are hard-linked from the cache where the file system allows it (synth then costs no
    copy); CDK only reads the bundle, so sharing inodes with the cache is safe."""
    source = (deps or build_deps()) / "python"
    site = output_dir / "python"
    site.mkdir(parents=True, exist_ok=True)
    for entry in layer_entries(source, layer):
        if entry.is_dir():
            shutil.copytree(entry, site / entry.name, copy_function=_link_or_copy, dirs_exist_ok=True)
        else:
            _link_or_copy(str(entry), str(site / entry.name))
    if layer == ENGINE_LAYER:
        shutil.copytree(ENGINE, site / "timelake", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)


@jsii.implements(ILocalBundling)
class EngineBundler:
    """CDK's local bundling hook: builds a layer on this machine instead of in Docker."""

    def __init__(self, layer: str = ENGINE_LAYER) -> None:
        self.layer = layer

    def try_bundle(self, output_dir: str, options: BundlingOptions) -> bool:
        bundle(Path(output_dir), self.layer)
        return True


def engine_layer_code(layer: str = ENGINE_LAYER) -> lambda_.Code:
    """A layer's code asset. Its hash is `layer_hash`, so CDK neither fingerprints the source
    folder nor re-bundles an asset it already has in its output folder."""
    return lambda_.Code.from_asset(
        str(ENGINE.parent),
        asset_hash=layer_hash(layer),
        asset_hash_type=AssetHashType.CUSTOM,
        bundling=BundlingOptions(image=DockerImage.from_registry("unused"), local=EngineBundler(layer)),
    )


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement.strip())[0]).lower()


def _strip_candidates() -> list[str]:
    names = ["llvm-strip", "aarch64-linux-gnu-strip", *sorted({p.name for d in os.get_exec_path() for p in Path(d).glob("llvm-strip-*")}), "strip"]
    return [tool for tool in map(shutil.which, names) if tool]


def _strips(tool: str, sample: Path) -> bool:
    """Whether ``tool`` can rewrite ``sample`` (checked on a copy)."""
    probe = sample.with_name(sample.name + ".strip-probe")
    try:
        return subprocess.run([tool, "--strip-unneeded", "-o", str(probe), str(sample)], capture_output=True).returncode == 0
    finally:
        probe.unlink(missing_ok=True)


def _engine_files() -> Iterator[Path]:
    return (p for p in sorted(ENGINE.rglob("*")) if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
