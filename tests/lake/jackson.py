"""Iceberg's shaded Jackson, rebuilt from the Jackson jars that pyspark ships.

The Iceberg Spark runtime jar on PyPI lacks the classes it relocated into
``org.apache.iceberg.shaded.com.fasterxml.jackson`` (the first query fails with
``ClassNotFoundException: …shaded.com.fasterxml.jackson.core.JsonFactoryBuilder``). Maven Central is
out of reach, so the same relocation the runtime's build does is done here: every class file's
CONSTANT_Utf8 entries that hold Jackson's internal names (``com/fasterxml/jackson/…``, also inside
descriptors and signatures) or dotted names (``com.fasterxml.jackson.…``, used by reflection and
service lookups) get the shaded prefix, the files move to the shaded folder, and META-INF/services
files are renamed and rewritten the same way. Only the constant pool changes, so nothing else in a
class file needs to move: attributes refer to constants by index, never by offset.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import tempfile
import zipfile
from pathlib import Path

SHADED = "org/apache/iceberg/shaded/"
SERVICES = "META-INF/services/"
# Jackson's names not yet under the prefix, so relocating twice changes nothing.
_INTERNAL = re.compile(rb"(?<!org/apache/iceberg/shaded/)com/fasterxml/jackson/")
_DOTTED = re.compile(rb"(?<!org\.apache\.iceberg\.shaded\.)com\.fasterxml\.jackson\.")

# Constant pool tags and the size of their payload after the tag byte (Utf8 is variable).
_FIXED = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
_WIDE = {5, 6}  # long and double take two slots


def relocate_text(data: bytes) -> bytes:
    """Jackson's names in ``data`` moved under the shaded prefix, in internal and dotted form."""
    data = _INTERNAL.sub(SHADED.encode() + rb"com/fasterxml/jackson/", data)
    return _DOTTED.sub(SHADED.replace("/", ".").encode() + rb"com.fasterxml.jackson.", data)


def relocate_class(data: bytes) -> bytes:
    """A class file whose constant pool names the shaded Jackson instead of Jackson."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ValueError("not a class file")
    count = struct.unpack_from(">H", data, 8)[0]
    out, pos, index = [data[:10]], 10, 1
    while index < count:
        tag = data[pos]
        if tag == 1:
            length = struct.unpack_from(">H", data, pos + 1)[0]
            text = relocate_text(data[pos + 3:pos + 3 + length])
            out.append(bytes([1]) + struct.pack(">H", len(text)) + text)
            pos += 3 + length
        elif tag in _FIXED:
            out.append(data[pos:pos + 1 + _FIXED[tag]])
            pos += 1 + _FIXED[tag]
        else:
            raise ValueError(f"unknown constant pool tag {tag} at byte {pos}")
        index += 2 if tag in _WIDE else 1
    out.append(data[pos:])
    return b"".join(out)


def relocate_jars(jars: list[Path], target: Path) -> Path:
    """Write ``target``: the classes and service files of ``jars`` under the shaded prefix.

    Multi-release variants (``META-INF/versions``) and module descriptors are left out: the base
    classes run on every Java, and the jar is read as a plain class-path jar.
    """
    tmp = Path(tempfile.mkstemp(dir=target.parent, suffix=".part")[1])
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            seen: set[str] = set()
            for jar in jars:
                with zipfile.ZipFile(jar) as src:
                    for info in src.infolist():
                        name = info.filename
                        if name.startswith("com/fasterxml/jackson/") and name.endswith(".class"):
                            new, data = SHADED + name, relocate_class(src.read(info))
                        elif name.startswith(SERVICES) and name != SERVICES and not name.endswith("/"):
                            new = SERVICES + relocate_text(name[len(SERVICES):].encode()).decode()
                            data = relocate_text(src.read(info))
                        else:
                            continue
                        if new not in seen:
                            seen.add(new)
                            out.writestr(zipfile.ZipInfo(new, date_time=(1980, 1, 1, 0, 0, 0)), data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def shaded_jackson(jars: list[Path], cache: Path) -> Path:
    """The relocated jar for ``jars``, built once into ``cache`` and keyed by the jars' names and sizes
    (a new pyspark brings new names), so every later session starts from the cached file."""
    key = hashlib.sha256(repr(sorted((j.name, j.stat().st_size) for j in jars)).encode()).hexdigest()[:16]
    target = cache / f"iceberg-shaded-jackson-{key}.jar"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        relocate_jars(jars, target)
    return target
