"""The engine layer, built without Docker.

Lambda allows 250 MB unzipped for a function and all its layers, and we keep each function under
200 MiB to leave room to grow; pyarrow + duckdb + numpy alone come close to that. So
the layers hold the engine's runtime dependencies as Linux aarch64 / CPython 3.12 wheels installed
with pip (no compiler, no container), minus what a Lambda never loads or its runtime already has,
with their shared objects stripped, split so each function gets only what it imports. Every removal
below names why it is safe; `tests/infra/test_lambda_size.py` measures each function of the
synthesized template, checks that no kept binary lost a library it links against, and runs each
handler with nothing but its own layers.

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
import struct
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
    "urllib3": "part of the Lambda Python runtime (botocore's); a copy here would also shadow it for botocore",
    "python-dateutil": "part of the Lambda Python runtime (botocore's); strictyaml imports it",
    "jmespath": "part of the Lambda Python runtime (botocore's)",
    "six": "part of the Lambda Python runtime (python-dateutil's)",
    "fsspec": "only pyiceberg's fsspec file IO imports it; pyiceberg picks pyarrow's for s3:// first",
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
    "pyiceberg-core": "pyiceberg loads it only to partition rows when it writes a partitioned table itself; Lambda "
                      "code writes through timelake.model.commit, which partitions them (31.8 MB)",
}
# Kept although no Lambda of the default stack (Glue) imports them: pyiceberg's REST catalog, which the
# stack's other catalogs use (the Glue Iceberg REST endpoint, S3 Tables), needs `requests`, and with it
# charset-normalizer, idna and certifi (its CA bundle: about 0.3 MB); the SigV4 signing it adds comes from
# botocore, which the Lambda runtime has. tests/catalogs/test_rest_on_lambda.py runs it from the layer.
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
    # Parquet modular encryption and Feather files: pyarrow.dataset imports the encryption module
    # inside try/except ImportError, and only pyarrow.feather imports _feather.
    "pyarrow/_parquet_encryption.*.so", "pyarrow/_dataset_parquet_encryption.*.so",
    "pyarrow/libarrow_python_parquet_encryption.so*", "pyarrow/parquet/encryption.py",
    "pyarrow/_feather.*.so", "pyarrow/feather.py",
    # numpy's submodules that `import numpy` loads only on first attribute access (numpy.__getattr__)
    # and that nothing here uses, its SIMD self-test and C test extensions, and its PyInstaller hook.
    "numpy/random", "numpy/fft", "numpy/polynomial", "numpy/f2py", "numpy/testing", "numpy/_pyinstaller",
    "numpy/_core/_simd.*.so", "numpy/_core/_*_tests.*.so",
    # Powertools serves these files only for a Swagger UI route (enable_swagger), which the API does not add.
    "aws_lambda_powertools/event_handler/openapi/swagger_ui/*.js", "aws_lambda_powertools/event_handler/openapi/swagger_ui/*.css",
    # DuckDB's PySpark-compatible API and query-plan viewer, and its ADBC entry point (DuckDB is used directly).
    "duckdb/experimental", "duckdb/query_graph", "adbc_driver_duckdb",
    # Wheels cannot hold symlinks, so each versioned name is a full copy; the loader only asks
    # for the SONAME (``.so.2600``), the other two names serve C++ extension builds.
    "pyarrow/libarrow_python.so", "pyarrow/libarrow_python.so.*.*.*",
    # zstandard ships a C extension and a cffi backend of the same code; it loads the C one.
    "zstandard/_cffi.*.so", "zstandard/backend_cffi.py",
    # charset-normalizer's compiled twins of its own cd.py and md.py (0.6 MB), which Python imports
    # instead when they are absent; requests asks it only to guess the encoding of an answer without a
    # charset, and the REST catalogs answer JSON.
    "charset_normalizer/*.so",
    # pyiceberg's Hive catalog client (thrift stubs).
    "hive_metastore", "fb303",
    # The C++ sources and headers the ADBC driver manager ships beside its compiled extension.
    "adbc_driver_manager/*.cc", "adbc_driver_manager/*.h", "adbc_driver_manager/*.hpp",
    "adbc_driver_manager/arrow-adbc", "adbc_driver_manager/toml++",
)

# Dependencies only some functions import, each shipped as its own layer (globs over the top of
# ``python/``): DuckDB alone is 63 MB, the PostgreSQL driver 9.5 MB. `infra.stack.FunctionSpec`
# says which function gets which.
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
        tool = strip_binaries(partial / "python")
        if tool is None and target == LAMBDA:
            raise RuntimeError("no strip tool on this machine reads aarch64 objects: put llvm-strip on the PATH "
                               "(Debian: apt-get install llvm); unstripped, the layers do not fit Lambda's 250 MB")
        (partial / "stripped-with.txt").write_text(f"{tool or 'nothing: no strip for this CPU'}\n")
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

    Each object is stripped into a copy that replaces it only if it is smaller and the loader maps
    exactly the same memory from it (`same_image`). That check is what makes stripping the objects
    of packages repaired with grafted libraries (numpy and its ``numpy.libs``, 2.4 MB) safe:
    auditwheel rewrote them with patchelf, which appends a segment after the symbol tables, and
    stripping such objects is a known way to break them; a strip that moved or changed a mapped
    byte is refused here instead of failing at a Lambda's first import."""
    objects = [path for path in sorted(site.rglob("*.so*")) if path.is_file()]
    tool = next((tool for tool in _strip_candidates() if objects and _strips(tool, objects[0])), None)
    if tool:
        for path in objects:
            copy = path.with_name(path.name + ".stripped")
            subprocess.run([tool, "--strip-unneeded", "-o", str(copy), str(path)], check=True)
            if copy.stat().st_size < path.stat().st_size and same_image(path.read_bytes(), copy.read_bytes()):
                copy.replace(path)
            else:
                copy.unlink()
    return tool


def same_image(original: bytes, stripped: bytes) -> bool:
    """Whether the dynamic loader maps the same memory from two ELF64 little-endian objects: the same
    segments (type, flags, address, sizes, alignment) holding the same bytes, wherever in the file
    each one lies, as long as its offset stays congruent to its address modulo the alignment (else
    the loader cannot map it). The ELF header may differ only in where the section headers are
    (``e_shoff``, ``e_shnum``...), which the loader never reads, and the program headers only in
    the segments' file offsets."""
    return (image := _image(original)) is not None and image == _image(stripped)


def _image(data: bytes) -> tuple[bytes, list[tuple[int, int, int, int, int, int, bytes]]] | None:
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return None
    (table,), (entry_size, count) = struct.unpack_from("<Q", data, 0x20), struct.unpack_from("<HH", data, 0x36)
    headers = [struct.unpack_from("<IIQQQQQQ", data, table + i * entry_size) for i in range(count)]
    masked = bytearray(data)
    for start, length in [(0x28, 8), (0x3A, 6), *((table + i * entry_size + 8, 8) for i in range(count))]:
        masked[start:start + length] = bytes(length)
    segments = []
    for kind, flags, offset, address, _, file_size, memory_size, align in headers:
        if align > 1 and offset % align != address % align:  # the loader could not map it
            return None
        segments.append((kind, flags, address, file_size, memory_size, align, bytes(masked[offset:offset + file_size])))
    return bytes(masked[:64]), segments


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
    if layer == ENGINE_LAYER:  # not the compiled parts built for this machine (Lambda's is aarch64), nor their sources
        shutil.copytree(ENGINE, site / "timelake", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.c", "*.h"),
                        dirs_exist_ok=True)


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
