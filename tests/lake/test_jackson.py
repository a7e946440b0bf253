"""The rebuilt shaded Jackson: every Jackson class Iceberg's runtime names is there, under the shaded
name, and no class in it still names the unshaded Jackson (the JVM would load Spark's copy instead)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from tests.lake.jackson import relocate_class, shaded_jackson
from tests.lake.spark import JACKSON, RUNTIME_JAR

SHADED_NAME = re.compile(rb"org/apache/iceberg/shaded/com/fasterxml/jackson/[A-Za-z0-9_/$]+")


@pytest.fixture(scope="module")
def relocated(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    import pyspark

    jars = [jar for name in JACKSON for jar in (Path(pyspark.__file__).parent / "jars").glob(f"{name}-2.*.jar")]
    return zipfile.ZipFile(shaded_jackson(jars, tmp_path_factory.mktemp("jars")))


def test_every_jackson_class_the_runtime_names_is_there(relocated: zipfile.ZipFile) -> None:
    import snowpark_connect_deps_iceberg

    named: set[bytes] = set()
    with zipfile.ZipFile(snowpark_connect_deps_iceberg.get_jar_path(RUNTIME_JAR)) as runtime:
        for info in runtime.infolist():
            if info.filename.endswith(".class") and "/shaded/com/fasterxml/" not in info.filename:
                named.update(SHADED_NAME.findall(runtime.read(info)))
    held = {name.removesuffix(".class") for name in relocated.namelist()}
    classes = {name.decode() for name in named if not name.endswith(b"/")}
    assert len(classes) > 80
    assert sorted(classes - held) == []


def test_no_class_names_the_unshaded_jackson(relocated: zipfile.ZipFile) -> None:
    classes = [name for name in relocated.namelist() if name.endswith(".class")]
    assert classes and all(name.startswith("org/apache/iceberg/shaded/com/fasterxml/jackson/") for name in classes)
    for name in classes:
        data = relocated.read(name)
        assert data.count(b"com/fasterxml/jackson/") == data.count(b"org/apache/iceberg/shaded/com/fasterxml/jackson/")
        assert data.count(b"com.fasterxml.jackson.") == data.count(b"org.apache.iceberg.shaded.com.fasterxml.jackson.")
        assert relocate_class(data) == data  # nothing left to move: the constant pool reads back byte for byte


def test_service_files_name_the_shaded_classes(relocated: zipfile.ZipFile) -> None:
    services = {name: relocated.read(name).decode().split() for name in relocated.namelist()
                if name.startswith("META-INF/services/")}
    assert services["META-INF/services/org.apache.iceberg.shaded.com.fasterxml.jackson.core.JsonFactory"] == [
        "org.apache.iceberg.shaded.com.fasterxml.jackson.core.JsonFactory"]
    held = set(relocated.namelist())
    assert all(f"{c.replace('.', '/')}.class" in held for classes in services.values() for c in classes)
