"""The composition root gives a runtime its catalog, object IO and clock, as it gives it the job store, the
event bus and the alarm sink: the ports only describe them."""

from __future__ import annotations

import pyarrow as pa
import pytest

from timelake.adapters import compose
from timelake.adapters.local import SystemClock
from timelake.adapters.objects import ArrowObjects, SharedFileIO
from timelake.errors import CatalogUnsupported
from timelake.ports.runtime import LakeConfig


def test_a_runtime_reads_tables_through_the_shared_file_io_and_runs_on_the_system_clock(tmp_path):
    """The catalog names `SharedFileIO` to pyiceberg by its import path (``py-io-impl``), which no type
    checker follows: a path that no longer names it fails every table load."""
    rt = compose(LakeConfig.embedded(tmp_path))
    assert isinstance(rt.objects, ArrowObjects) and isinstance(rt.clock, SystemClock)
    assert rt.catalog is rt.catalog  # built once, on first use
    rt.catalog.create_namespace("iot")
    rt.catalog.create_table("iot.t", schema=pa.schema([pa.field("x", pa.int64())]))
    assert type(rt.load_table("iot.t").io) is SharedFileIO


def test_a_catalog_pyiceberg_cannot_load_is_refused_in_one_line(tmp_path):
    config = LakeConfig.embedded(tmp_path).model_copy(update={"catalog_name": "odd", "catalog_props": {"type": "nonsense"}})
    with pytest.raises(CatalogUnsupported, match="^catalog 'odd': "):
        compose(config).catalog  # noqa: B018
