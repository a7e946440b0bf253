"""Real Apache Iceberg Java (1.10, through Spark 3.5) on the tables the engine writes, as another engine in
a shared lake runs it: maintenance procedures, Spark SQL writes and schema changes.

Iceberg's `JdbcCatalog` reads the embedded warehouse's own SQLite catalog file. The Spark catalog is
named like the engine's catalog (`timelake`), because the JDBC rows are keyed by that name
(`iceberg_tables.catalog_name`).

One JVM serves a whole test session; `SparkLake.use(warehouse)` points the catalog at another
warehouse by changing the catalog's Spark conf and dropping the loaded catalog, which costs
milliseconds instead of a JVM start.

The catalog file's lock: `JdbcCatalog.initialize` reads `DatabaseMetaData.getTables` and
`getColumns` and never closes those result sets, so the pooled SQLite connection keeps a statement
open, and with it a SHARED lock on the file, for as long as the catalog lives: every other writer then
gets `database is locked`. So each operation here closes the Iceberg catalog when it ends (which
closes its connection pool) and drops it from Spark's catalog manager; the next operation opens a
new one. The lock is thus held only while an operation runs. `held()` keeps the catalog open across
several operations, for a test that wants the engine to meet that lock.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table as IcebergTable

from tests.lake.jackson import shaded_jackson
from timelake.ports.runtime import LakeConfig

RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JACKSON = ("jackson-core", "jackson-databind", "jackson-annotations", "jackson-datatype-jsr310")
SQLITE_JDBC = Path("/usr/share/java/sqlite-jdbc.jar")
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def jars() -> list[Path]:
    """The class path: Iceberg's Spark runtime, its shaded Jackson (built once into the virtualenv)
    and the SQLite JDBC driver from Debian's ``libxerial-sqlite-jdbc-java``."""
    import pyspark
    import snowpark_connect_deps_iceberg

    if not SQLITE_JDBC.exists():
        raise RuntimeError(f"{SQLITE_JDBC} is missing: install Debian's libxerial-sqlite-jdbc-java (make test-deps)")
    spark_jars = Path(pyspark.__file__).parent / "jars"
    jackson = [jar for name in JACKSON for jar in spark_jars.glob(f"{name}-2.*.jar")]
    if len(jackson) != len(JACKSON):
        raise RuntimeError(f"pyspark's jars hold {[j.name for j in jackson]}, not one jar each of {JACKSON}")
    cache = Path(sys.prefix) / "share" / "timelake-tests" / "jars"
    return [snowpark_connect_deps_iceberg.get_jar_path(RUNTIME_JAR), shaded_jackson(jackson, cache), SQLITE_JDBC]


def sqlite_jni_dir() -> str:
    """Where Debian's ``libxerial-sqlite-jdbc-jni`` put ``libsqlitejdbc.so`` (the driver loads it from
    ``java.library.path``: Debian's jar carries no native libraries)."""
    found = sorted(Path("/usr/lib").glob("*/jni/libsqlitejdbc.so"))
    if not found:
        raise RuntimeError("libsqlitejdbc.so is missing: install Debian's libxerial-sqlite-jdbc-jni (make test-deps)")
    return str(found[0].parent)


def session_conf(scratch: Path) -> dict[str, str]:
    """Spark settings for a small, quiet, loopback-only driver on a two-core machine, with Iceberg's SQL
    extensions (ADD PARTITION FIELD, CALL)."""
    return {
        "spark.master": "local[2]",
        "spark.app.name": "timelake-tests",
        "spark.driver.memory": "768m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraClassPath": os.pathsep.join(str(jar) for jar in jars()),
        "spark.driver.extraLibraryPath": sqlite_jni_dir(),
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.warehouse.dir": str(scratch / "spark-warehouse"),
        "spark.local.dir": str(scratch / "spark-local"),
        "spark.sql.extensions": EXTENSIONS,
    }


def catalog_conf(config: LakeConfig) -> dict[str, str]:
    """The Spark conf of an Iceberg `JdbcCatalog` on an embedded lake's catalog file, under the
    catalog's own name. ``clients=1``: one pooled connection, so Spark never blocks itself on the file;
    ``jdbc.busy_timeout`` (ms, passed to the driver): Spark waits out a commit of the engine instead of
    failing at once."""
    props = config.catalog_props
    prefix = f"spark.sql.catalog.{config.catalog_name}"
    return {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": "jdbc:sqlite:" + props["uri"].removeprefix("sqlite:///").partition("?")[0],  # less SQLAlchemy's options
        f"{prefix}.warehouse": props["warehouse"],
        f"{prefix}.jdbc.schema-version": "V1",
        f"{prefix}.jdbc.busy_timeout": "10000",
        f"{prefix}.cache-enabled": "false",
        f"{prefix}.clients": "1",
    }


def start_session(scratch: Path) -> Any:
    """A SparkSession in a new JVM (one per process: pyspark keeps one SparkContext)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in session_conf(scratch).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _millis(at: datetime | None) -> int:
    """``at`` in epoch milliseconds; by default the millisecond after now: Java keeps what is not
    strictly older, and a file or snapshot made in this very millisecond is meant to go too."""
    return int(at.timestamp() * 1000) if at else int(time.time() * 1000) + 1


def _timestamp(at: datetime | None) -> str:
    moment = datetime.fromtimestamp(_millis(at) / 1000, UTC)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}'"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class SparkLake:
    """Spark with Iceberg Java on one embedded warehouse at a time. Every method runs its statement to
    the end (results collected, nothing lazy left behind) and releases the catalog file. Operations
    from several threads (a Spark writer beside a running job) take turns: releasing the catalog
    under a running statement would break it."""

    def __init__(self, session: Any, warehouse: Path) -> None:
        self.session = session
        self._turn = threading.RLock()
        self._holding = 0
        self.use(warehouse)

    # -- the catalog ----------------------------------------------------------------------------------

    def use(self, warehouse: Path) -> SparkLake:
        """Point the catalog at ``warehouse`` (a folder ``timelake.connect(warehouse=...)`` made)."""
        with self._turn:
            self.release()
            self.config = LakeConfig.embedded(warehouse)
            self.catalog_name = self.config.catalog_name
            self.warehouse = Path(warehouse)
            for key, value in catalog_conf(self.config).items():
                self.session.conf.set(key, value)
        return self

    def release(self) -> None:
        """Close every Iceberg catalog Spark has loaded (and so their SQLite connections) and forget
        them, so that no lock stays on a catalog file. The next statement loads a fresh catalog."""
        with self._turn:
            manager = self.session._jsparkSession.sessionState().catalogManager()
            loaded = _loaded_catalogs(manager)
            for plugin in loaded.values():
                if plugin.getClass().getName() == "org.apache.iceberg.spark.SparkCatalog":
                    plugin.icebergCatalog().close()
            if loaded:
                manager.reset()

    @contextlib.contextmanager
    def held(self) -> Iterator[SparkLake]:
        """Keep the catalog open across the operations inside, as a long-lived Spark application does:
        the catalog file stays locked until the block ends."""
        self._holding += 1
        try:
            yield self
        finally:
            self._holding -= 1
            if not self._holding:
                self.release()

    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        with self._turn:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", module="pyspark")  # its pandas bridge uses deprecated pandas API
                    yield
            finally:
                if not self._holding:
                    self.release()

    def pyiceberg_catalog(self) -> Catalog:
        """The same catalog through plain pyiceberg (its own PyArrow FileIO, not the engine's)."""
        return load_catalog(self.config.catalog_name, **self.config.catalog_props)

    def pyiceberg_table(self, table: str) -> IcebergTable:
        return self.pyiceberg_catalog().load_table(table)

    def name(self, table: str) -> str:
        return f"{self.catalog_name}.{table}"

    # -- SQL ----------------------------------------------------------------------------------------

    def sql(self, statement: str) -> list[dict[str, Any]]:
        """Run one Spark SQL statement; its result rows as dicts."""
        with self._operation():
            return [row.asDict(recursive=True) for row in self.session.sql(statement).collect()]

    def rows(self, table: str, ref: str | None = None, where: str | None = None) -> pa.Table:
        """The rows Spark reads from ``table`` (at branch or tag ``ref``), as Arrow with UTC timestamps."""
        query = f"SELECT * FROM {self.name(table)}"
        if ref:
            query += f" VERSION AS OF {_quote(ref)}"
        if where:
            query += f" WHERE {where}"
        with self._operation():
            frame = self.session.sql(query).toPandas()
        arrow = pa.Table.from_pandas(frame, preserve_index=False)
        columns = [col.cast(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(col.type) else col
                   for col in arrow.columns]
        return pa.table(columns, names=arrow.column_names)

    def insert(self, table: str, rows: pa.Table) -> None:
        """``INSERT INTO table SELECT …`` from ``rows``, as a Spark job writing to the lake does."""
        view = f"rows_{time.monotonic_ns()}"
        with self._operation():
            self.session.createDataFrame(rows.to_pandas()).createOrReplaceTempView(view)
            try:
                columns = ", ".join(f"`{name}`" for name in rows.column_names)
                self.session.sql(f"INSERT INTO {self.name(table)} ({columns}) SELECT {columns} FROM {view}").collect()
            finally:
                self.session.catalog.dropTempView(view)

    def add_column(self, table: str, column: str, sql_type: str) -> None:
        self.sql(f"ALTER TABLE {self.name(table)} ADD COLUMN {column} {sql_type}")

    def add_partition_field(self, table: str, transform: str) -> None:
        """``ALTER TABLE … ADD PARTITION FIELD transform``, e.g. ``bucket(4, device_id)``."""
        self.sql(f"ALTER TABLE {self.name(table)} ADD PARTITION FIELD {transform}")

    # -- maintenance ----------------------------------------------------------------------------------

    def _call(self, procedure: str, table: str, **args: str) -> dict[str, Any]:
        named = ", ".join([f"table => {_quote(table)}", *(f"{key} => {value}" for key, value in args.items())])
        rows = self.sql(f"CALL {self.catalog_name}.system.{procedure}({named})")
        return rows[0] if rows else {}

    def expire_snapshots(self, table: str, older_than: datetime | None = None, retain_last: int = 1) -> dict[str, Any]:
        """``CALL system.expire_snapshots`` with ``older_than`` now by default: the procedure's counts
        (deleted_data_files_count, deleted_manifest_files_count, …)."""
        return self._call("expire_snapshots", table, older_than=_timestamp(older_than), retain_last=str(retain_last))

    def rewrite_data_files(self, table: str, where: str | None = None, **options: str) -> dict[str, Any]:
        """``CALL system.rewrite_data_files`` (a compaction: one ``replace`` snapshot), e.g.
        ``rewrite_data_files(t, **{"min-input-files": "2"})``: the procedure's counts."""
        args = {}
        if options:
            args["options"] = "map(" + ", ".join(f"{_quote(k)}, {_quote(v)}" for k, v in options.items()) + ")"
        if where:
            args["where"] = _quote(where)
        return self._call("rewrite_data_files", table, **args)

    def rewrite_manifests(self, table: str) -> dict[str, Any]:
        return self._call("rewrite_manifests", table)

    def remove_orphan_files(self, table: str, older_than: datetime | None = None) -> list[str]:
        """Delete the files under the table's location that no snapshot references and that are older
        than ``older_than`` (now by default), through the Java API: the SQL procedure refuses
        anything under 24 hours. The deleted locations, as Java spells them (``file:/…``)."""
        jvm = self.session._jvm
        with self._operation():
            iceberg = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(self.session._jsparkSession, self.name(table))
            action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(self.session._jsparkSession)
            result = action.deleteOrphanFiles(iceberg).olderThan(_millis(older_than)).execute()
            found, locations = [], result.orphanFileLocations().iterator()
            while locations.hasNext():
                found.append(str(locations.next()))
        return sorted(found)


@dataclass
class ColumnChunk:
    """One column of one row group as parquet-mr (the Parquet library Iceberg Java writes and reads with) reads
    it: its codec, the values of each data page, whether every data page is dictionary-encoded, the pages its
    page index (offset index with a column index beside it) lists (None without one), and its bloom filter (bitset
    bytes, and which probed values it may hold; None when it has none)."""

    codec: str
    page_values: list[int]
    dictionary_only: bool
    indexed_pages: int | None
    bloom_bytes: int | None
    bloom_holds: dict[Any, bool]


@dataclass
class RowGroup:
    rows: int
    compressed_bytes: int
    columns: dict[str, ColumnChunk]


def parquet_row_groups(session: Any, location: str, probe: dict[str, list[Any]] | None = None) -> list[RowGroup]:
    """A Parquet file's row groups read page by page with parquet-mr; ``probe`` names values (strings or floats)
    to look up in each column's bloom filter."""
    jvm = session._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration()
    source = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(
        jvm.org.apache.hadoop.fs.Path(f"file://{local_path(location)}"), conf)
    reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(source)
    try:
        blocks, descriptors = reader.getFooter().getBlocks(), reader.getFooter().getFileMetaData().getSchema().getColumns()
        groups = []
        for b in range(blocks.size()):
            block, pages = blocks.get(b), reader.readNextRowGroup()
            columns = {}
            for c in range(descriptors.size()):
                chunk = block.getColumns().get(c)
                name = chunk.getPath().toDotString()
                counts, page_reader = [], pages.getPageReader(descriptors.get(c))
                while (page := page_reader.readPage()) is not None:
                    counts.append(page.getValueCount())
                bloom = reader.readBloomFilter(chunk)
                holds = {} if bloom is None else {
                    v: bloom.findHash(bloom.hash(jvm.org.apache.parquet.io.api.Binary.fromString(v) if isinstance(v, str) else v))
                    for v in (probe or {}).get(name, [])}
                stats, offsets = chunk.getEncodingStats(), reader.readOffsetIndex(chunk)
                indexed = None if offsets is None or reader.readColumnIndex(chunk) is None else offsets.getPageCount()
                columns[name] = ColumnChunk(chunk.getCodec().name(), counts,
                                            stats is not None and not stats.hasNonDictionaryEncodedPages(), indexed,
                                            None if bloom is None else bloom.getBitsetSize(), holds)
            groups.append(RowGroup(block.getRowCount(), block.getCompressedSize(), columns))
        return groups
    finally:
        reader.close()


def _loaded_catalogs(manager: Any) -> dict[str, Any]:
    """The catalogs Spark's CatalogManager has instantiated (a private map: asking the manager for a
    catalog by name would load one)."""
    field = next(f for f in manager.getClass().getDeclaredFields() if f.getName().endswith("catalogs"))
    field.setAccessible(True)
    loaded = field.get(manager)
    return {str(key): loaded.apply(key) for key in _scala_keys(loaded)}


def _scala_keys(scala_map: Any) -> list[Any]:
    keys, iterator = [], scala_map.keysIterator()
    while iterator.hasNext():
        keys.append(iterator.next())
    return keys


# -- what the metadata references -------------------------------------------------------------------

def local_path(location: str) -> Path:
    """The local path of a ``file:/…``, ``file:///…`` or plain location (the forms Java and pyiceberg write)."""
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"{location}: not a local file location")
    return Path(unquote(parsed.path))


def referenced_files(table: IcebergTable) -> dict[str, set[int]]:
    """Every data and delete file that a snapshot still in the metadata references (live entries, ADDED
    or EXISTING), as a local path, with the ids of the snapshots that reference it. Every ref points at
    one of these snapshots, so this covers main, every branch (``backfill/<job>`` too) and tag, and
    their histories."""
    return _walk(table)[1]


def missing_files(table: IcebergTable) -> list[str]:
    """What the table's metadata references but the disk lacks: refs to snapshots that are gone,
    manifest lists, manifests, and data or delete files of any retained snapshot. Empty when every
    snapshot of every ref can still be read."""
    problems, files = _walk(table)
    return problems + [f"data file {path}" for path in sorted(files) if not Path(path).exists()]


def _walk(table: IcebergTable) -> tuple[list[str], dict[str, set[int]]]:
    problems = [f"ref {name} -> snapshot {ref.snapshot_id}: no such snapshot"
                for name, ref in table.metadata.refs.items() if table.snapshot_by_id(ref.snapshot_id) is None]
    entries: dict[str, list[str]] = {}
    files: dict[str, set[int]] = {}
    for snapshot in table.metadata.snapshots:
        if not local_path(snapshot.manifest_list).exists():
            problems.append(f"snapshot {snapshot.snapshot_id}: manifest list {snapshot.manifest_list}")
            continue
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path not in entries:
                if not local_path(manifest.manifest_path).exists():
                    problems.append(f"manifest {manifest.manifest_path}")
                    entries[manifest.manifest_path] = []
                    continue
                entries[manifest.manifest_path] = [
                    str(local_path(entry.data_file.file_path))
                    for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]
            for path in entries[manifest.manifest_path]:
                files.setdefault(path, set()).add(snapshot.snapshot_id)
    return problems, files
