"""Spark with real Iceberg Java for the shared-lake tests: one JVM per test process, pointed at each
test's own warehouse.

Every test that uses the `spark` fixture is put in the xdist group ``spark`` (run with
``--dist loadgroup``, as `make test` does), so that all of them land on one worker and one JVM
serves them all; without xdist they simply share the session's JVM.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lake.spark import SparkLake, start_session

SPARK_FIXTURES = {"spark", "spark_session"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group the tests that start Spark; tryfirst: xdist reads the group in its own hook."""
    for item in items:
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    session = start_session(tmp_path_factory.mktemp("spark"))
    yield session
    session.stop()


@pytest.fixture
def spark(request: pytest.FixtureRequest, spark_session: Any, warehouse: Path) -> Iterator[SparkLake]:
    """Spark's Iceberg catalog on this test's warehouse (the one `lake` and `sensor` use)."""
    if getattr(request.config.option, "loadgroup", False) and not request.node.nodeid.endswith("@spark"):
        pytest.fail("pytest-xdist did not put this test in the 'spark' group, so every worker would start a JVM: "
                    "check the pytest and pytest-xdist versions pinned in pyproject.toml")
    harness = SparkLake(spark_session, warehouse)
    yield harness
    harness.release()
