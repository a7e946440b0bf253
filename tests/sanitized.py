"""A compiled part of the package built with AddressSanitizer and UndefinedBehaviorSanitizer and exercised in
a child interpreter, for the tests of each compiled module.

The module is compiled as the install does, plus the sanitizers; the child loads the ASan runtime first (it
must come before any other library) and runs the test's code against the sanitized build. Any report of
either sanitizer stops the child with an error, which fails the test with the report.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def run_sanitized(source: Path, tmp_path: Path, entry: str, timeout: float) -> str:
    """Builds ``source`` with both sanitizers and runs ``entry(library_path)`` (``module:function`` of the
    tests) in a child; returns what the child printed, once it ended cleanly."""
    compiler = shutil.which("gcc")
    assert compiler, "gcc is missing: it builds the compiled modules at install too"
    library = tmp_path / f"{source.stem}{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    subprocess.run([compiler, "-shared", "-fPIC", *flags, f"-I{sysconfig.get_paths()['include']}", str(source),
                    "-o", str(library)], check=True, capture_output=True, timeout=120)
    runtime = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True)
    env = {**os.environ, "LD_PRELOAD": runtime.stdout.strip(), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "PYTHONPATH": f"{ROOT}:{ROOT / 'layers'}"}
    module, function = entry.split(":")
    child = subprocess.run([sys.executable, "-c", f"from {module} import {function}; {function}({str(library)!r})"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    report = child.stderr[-4000:]
    assert child.returncode == 0, report
    assert "runtime error" not in child.stderr and "Sanitizer" not in child.stderr, report
    return child.stdout


def load(library: str, name: str) -> ModuleType:
    """The sanitized build at ``library`` as module ``name``, in the child."""
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
