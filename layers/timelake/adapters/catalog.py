"""The Iceberg catalog a `LakeConfig` names, loaded by pyiceberg: `Runtime.catalog` is built here, on
first use, through the factory the composition root gives the runtime."""

from __future__ import annotations

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.io import PY_IO_IMPL

from timelake.errors import CatalogUnsupported
from timelake.ports.runtime import LakeConfig

SHARED_FILE_IO = "timelake.adapters.objects.SharedFileIO"


def catalog_for(config: LakeConfig) -> Catalog:
    """The catalog, with `SharedFileIO` unless the config names its own FileIO."""
    try:
        return load_catalog(config.catalog_name, **{PY_IO_IMPL: SHARED_FILE_IO, **config.catalog_props})
    except ValueError as exc:  # pyiceberg's word for a type it does not know or a missing property
        raise CatalogUnsupported(f"catalog '{config.catalog_name}': {exc}") from None
