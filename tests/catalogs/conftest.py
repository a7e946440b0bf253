"""Catalogs for the catalog tests, each defined the pyiceberg way (``.pyiceberg.yaml`` in
$PYICEBERG_HOME, or ``PYICEBERG_CATALOG__<NAME>__*`` variables) and chosen by name with ``--catalog``:
pyiceberg's SQL catalog on SQLite and on PostgreSQL, Glue on moto, and Iceberg's own REST catalog
server over JDBC catalogs on the same PostgreSQL.

Job records and scratch files stay in each test's warehouse folder whatever the catalog.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.aws_fixtures import aws, moto_server  # noqa: F401
from tests.catalogs.rest_server import RestServer, running_rest_server
from tests.conftest import cli_main
from tests.sources.conftest import PgServer, postgres  # noqa: F401

BUCKET = "lake"


@dataclass
class NamedCatalog:
    """A catalog the tests reach only by its name, as a user of ``--catalog NAME`` does."""

    name: str
    props: dict[str, str]
    warehouse: Path  # the timelake warehouse folder: job records and scratch files
    extra: dict[str, Any] = field(default_factory=dict)


def define_in_yaml(home: Path, name: str, props: dict[str, str]) -> None:
    """Add catalog ``name`` to ``home/.pyiceberg.yaml``."""
    path = home / ".pyiceberg.yaml"
    lines = path.read_text().splitlines() if path.exists() else ["catalog:"]
    lines += [f"  {name}:", *(f"    {key}: {json.dumps(value)}" for key, value in props.items())]
    path.write_text("\n".join(lines) + "\n")


def define_in_env(monkeypatch: pytest.MonkeyPatch, name: str, props: dict[str, str]) -> None:
    """``PYICEBERG_CATALOG__<NAME>__<PROPERTY>`` variables: ``-`` is written ``_`` and ``.`` is ``__``."""
    for key, value in props.items():
        variable = key.replace(".", "__").replace("-", "_").upper()
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper().replace('-', '_')}__{variable}", value)


@pytest.fixture
def pyiceberg_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty $PYICEBERG_HOME and no catalog variables: only what a test defines is known."""
    home = tmp_path / "pyiceberg-home"
    home.mkdir()
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TIMELAKE_CATALOG", raising=False)
    for variable in [v for v in os.environ if v.upper().startswith("PYICEBERG_CATALOG__")]:
        monkeypatch.delenv(variable)
    return home


@pytest.fixture
def sqlite_catalog(tmp_path: Path, pyiceberg_home: Path) -> NamedCatalog:
    """pyiceberg's SQL catalog on a SQLite file, defined in .pyiceberg.yaml."""
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/iceberg"}
    define_in_yaml(pyiceberg_home, "lite", props)
    return NamedCatalog("lite", props, tmp_path / "lake")


def _database(server: PgServer, prefix: str) -> str:
    name = f"{prefix}_{secrets.token_hex(4)}"
    server.sql(f"CREATE DATABASE {name}", db="postgres")
    return name


@pytest.fixture
def pg_catalog(tmp_path: Path, pyiceberg_home: Path, rest_server: RestServer, monkeypatch: pytest.MonkeyPatch) -> NamedCatalog:
    """pyiceberg's SQL catalog on PostgreSQL, defined by PYICEBERG_CATALOG__PG_<ID>__* variables, in the
    database where the REST server's Java JDBC catalogs live (its own name keeps it apart from them)."""
    name = f"pg-{secrets.token_hex(4)}"
    props = {"type": "sql", "uri": rest_server.sql_uri, "warehouse": f"file://{tmp_path}/iceberg"}
    define_in_env(monkeypatch, name, props)
    return NamedCatalog(name, props, tmp_path / "lake")


@pytest.fixture
def glue_catalog(tmp_path: Path, pyiceberg_home: Path, aws: str) -> NamedCatalog:  # noqa: F811
    """pyiceberg's Glue catalog on moto (Glue and S3), defined in .pyiceberg.yaml."""
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    props = {"type": "glue", "warehouse": f"s3://{BUCKET}/warehouse", "glue.endpoint": aws, "glue.region": "us-east-1",
             "glue.access-key-id": "testing", "glue.secret-access-key": "testing", "s3.endpoint": aws,
             "s3.region": "us-east-1", "s3.access-key-id": "testing", "s3.secret-access-key": "testing"}
    define_in_yaml(pyiceberg_home, "glue", props)
    return NamedCatalog("glue", props, tmp_path / "lake")


@pytest.fixture(scope="session")
def rest_server(postgres: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestServer]:  # noqa: F811
    """Iceberg's REST catalog server (Java) for the session, its JDBC catalogs in one PostgreSQL database."""
    db = _database(postgres, "catalogs")
    root = tmp_path_factory.mktemp("rest-catalog")
    with running_rest_server(f"jdbc:postgresql://127.0.0.1:{postgres.port}/{db}", root, **{"jdbc.user": "postgres"}) as server:
        server.sql_uri = f"postgresql+psycopg2://postgres@127.0.0.1:{postgres.port}/{db}"
        yield server


@pytest.fixture
def rest_catalog(tmp_path: Path, pyiceberg_home: Path, rest_server: RestServer, monkeypatch: pytest.MonkeyPatch) -> NamedCatalog:
    """A REST catalog of its own on the shared server, defined by PYICEBERG_CATALOG__REST__* variables."""
    own = f"t{secrets.token_hex(6)}"  # the server's JDBC catalog for this test
    props = rest_server.catalog_props(own)
    define_in_env(monkeypatch, "rest", props)
    return NamedCatalog("rest", props, tmp_path / "lake", {"server_catalog": own, "sql_uri": rest_server.sql_uri})


def cli_json(*args: str) -> dict[str, Any]:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, err
    return json.loads(out)
