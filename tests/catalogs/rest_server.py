"""Iceberg's own REST catalog server side (`org.apache.iceberg.rest.CatalogHandlers`, in the Iceberg
runtime jar the shared-lake tests use) behind a small HTTP router, `RestCatalogServer.java`, compiled
here with javac against that jar and run in its own small JVM, over Iceberg's `JdbcCatalog` on
PostgreSQL.

The JVM starts once per test process (about two seconds) and serves every test: each test's client
names its own catalog as its ``warehouse``, which the server opens as a JDBC catalog of that name and
answers as the prefix of all the client's later requests.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.lake.spark import jars as spark_jars

SOURCE = Path(__file__).with_name("RestCatalogServer.java")
MAIN = "org.apache.iceberg.rest.RestCatalogServer"
POSTGRES_JDBC = Path("/usr/share/java/postgresql.jar")
# From pyspark's jars: Hadoop's Configuration and local file system, which Iceberg's HadoopFileIO uses
# (the JDBC catalog's default FileIO) and which the Iceberg runtime jar leaves to Spark.
HADOOP = ("hadoop-client-api-*.jar", "hadoop-client-runtime-*.jar", "commons-logging-*.jar", "slf4j-api-*.jar")


def class_path() -> list[Path]:
    import pyspark

    if not POSTGRES_JDBC.exists():
        raise RuntimeError(f"{POSTGRES_JDBC} is missing: install Debian's libpostgresql-jdbc-java (make test-deps)")
    iceberg, jackson = spark_jars()[:2]
    folder = Path(pyspark.__file__).parent / "jars"
    hadoop = [jar for pattern in HADOOP for jar in sorted(folder.glob(pattern))]
    if len(hadoop) != len(HADOOP):
        raise RuntimeError(f"pyspark's jars hold {[j.name for j in hadoop]}, not one jar each of {HADOOP}")
    return [iceberg, jackson, *hadoop, POSTGRES_JDBC]


def compiled(cache: Path = Path(sys.prefix) / "share" / "timelake-tests") -> Path:
    """The server's classes, compiled once per source and class path into the virtualenv."""
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac is missing: install Debian's openjdk-17-jdk-headless (make test-deps)")
    key = hashlib.sha256(SOURCE.read_bytes() + "\0".join(p.name for p in class_path()).encode()).hexdigest()[:16]
    target = cache / f"rest-server-{key}"
    if not target.is_dir():
        partial = cache / f"{target.name}.{os.getpid()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        subprocess.run([javac, "-nowarn", "-proc:none", "-cp", os.pathsep.join(map(str, class_path())), "-d", str(partial),
                        str(SOURCE)], check=True, capture_output=True, text=True, timeout=300)
        try:
            partial.rename(target)
        except OSError:  # another test process compiled it first
            shutil.rmtree(partial, ignore_errors=True)
    return target


@dataclass
class RestServer:
    uri: str
    warehouse_root: Path
    jdbc_uri: str
    sql_uri: str = ""  # the same database for SQLAlchemy (pyiceberg's SQL catalog), when the caller knows it

    def catalog_props(self, name: str, **extra: str) -> dict[str, str]:
        """pyiceberg's properties for a REST catalog ``name`` of this server (its own JDBC catalog)."""
        return {"type": "rest", "uri": self.uri, "warehouse": name, **extra}


@contextmanager
def running_rest_server(jdbc_uri: str, root: Path, **jdbc_props: str) -> Iterator[RestServer]:
    """The server on a free loopback port, its JDBC catalogs in ``jdbc_uri``, their warehouses under ``root``."""
    classes = compiled()
    port_file = root / "port"
    log = (root / "server.log").open("w")
    java = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
            "-cp", os.pathsep.join(map(str, [classes, *class_path()])), MAIN, str(port_file), jdbc_uri, str(root / "warehouse"),
            *(f"{key}={value}" for key, value in jdbc_props.items())]
    process = subprocess.Popen(java, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not port_file.exists():
            if process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the REST catalog server did not start: {(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.05)
        yield RestServer(f"http://127.0.0.1:{port_file.read_text()}", root / "warehouse", jdbc_uri)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
