"""`infra.layer.same_image`, the check that lets the layer build strip every shared object, also the
ones auditwheel rewrote with patchelf (numpy's), keeping a stripped copy only if the dynamic loader
would map exactly the same memory from it. Run on this machine's objects from the virtualenv."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import zstandard

from infra.layer import _strip_candidates, _strips, same_image

ORDINARY = next(Path(zstandard.__file__).parent.glob("backend_c.*.so"))  # built with its symbol table


@pytest.fixture(scope="module")
def tool() -> str:
    found = next((t for t in _strip_candidates() if _strips(t, ORDINARY)), None)
    assert found, "no strip tool for this machine's objects (llvm-strip: `make test-deps` installs it)"
    return found


def _stripped(tool: str, original: Path, folder: Path) -> Path:
    out = folder / (original.name + ".stripped")
    subprocess.run([tool, "--strip-unneeded", "-o", str(out), str(original)], check=True)
    return out


def _loads(path: Path) -> bool:
    """Whether the dynamic loader accepts the object (in a child process, so nothing stays loaded here)."""
    return subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"], capture_output=True).returncode == 0


def test_an_ordinary_object_stripped_maps_the_same_memory_and_any_mapped_change_is_seen(tool: str, tmp_path: Path) -> None:
    data = ORDINARY.read_bytes()
    stripped = _stripped(tool, ORDINARY, tmp_path)
    assert len(stripped.read_bytes()) < len(data) and same_image(data, stripped.read_bytes())

    (table,), (entry_size, count) = struct.unpack_from("<Q", data, 0x20), struct.unpack_from("<HH", data, 0x36)
    headers = [struct.unpack_from("<IIQQQQQQ", data, table + i * entry_size) for i in range(count)]
    executable = next(h for h in headers if h[0] == 1 and h[1] & 1)  # a PT_LOAD with PF_X: the code
    changed = bytearray(data)
    changed[executable[2] + executable[5] // 2] ^= 0xFF
    assert not same_image(data, bytes(changed)), "a changed byte of code"
    moved = bytearray(data)
    struct.pack_into("<Q", moved, table + headers.index(executable) * entry_size + 8, executable[2] + 8)  # p_offset off its page
    assert not same_image(data, bytes(moved)), "a segment the loader cannot map"
    relocated = bytearray(data)
    struct.pack_into("<Q", relocated, table + headers.index(executable) * entry_size + 16, executable[3] + 0x10000)  # p_vaddr
    assert not same_image(data, bytes(relocated)), "a segment mapped elsewhere"
    unsectioned = bytearray(data)
    struct.pack_into("<Q", unsectioned, 0x28, 0)  # e_shoff: only tools read section headers
    assert same_image(data, bytes(unsectioned))
    assert not same_image(b"not an ELF object", b"not an ELF object")


def test_a_patched_object_is_only_kept_stripped_when_it_still_loads(tool: str, tmp_path: Path) -> None:
    """numpy's OpenBLAS as auditwheel grafted it: patchelf appended a segment after the symbol tables.
    Whatever this strip tool makes of it, a copy that passes the check must load."""
    libs = shutil.copytree(Path(numpy.__file__).parent.parent / "numpy.libs", tmp_path / "numpy.libs")
    original = next(libs.glob("libscipy_openblas*.so"))
    stripped = _stripped(tool, original, libs)
    assert _loads(original)
    assert not same_image(original.read_bytes(), stripped.read_bytes()) or _loads(stripped)
