"""The REST catalogs of the AWS stack (the Glue Iceberg REST endpoint, S3 Tables) load from the Lambda
layer: pyiceberg's REST client with SigV4 signing, with nothing but the engine layer (the twin built
for this machine, pruned and stripped the same way) and the Lambda runtime's packages on the path,
against Iceberg's own REST server side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.catalogs.rest_server import RestServer
from tests.infra.test_lambda_size import lambda_paths  # noqa: F401

pytestmark = pytest.mark.slow

PROBE = r'''
import json, sys
settings = json.load(open(sys.argv[1]))
sys.path[:0] = settings["paths"]
import requests
assert requests.__file__.startswith(settings["paths"][0]), requests.__file__  # the layer's, not the runtime's
import pyarrow as pa
from requests.adapters import HTTPAdapter
from timelake.adapters import runtime_for
from timelake.ports.runtime import LakeConfig

config = LakeConfig(catalog_name="s3tables", catalog_props=settings["props"], store="sqlite:///" + settings["tmp"] + "/jobs.db",
                    staging="file://" + settings["tmp"] + "/staging")
catalog = runtime_for(config).catalog
adapter = catalog._session.get_adapter(settings["props"]["uri"])
assert type(adapter).__name__ == "SigV4Adapter" and isinstance(adapter, HTTPAdapter), type(adapter)
catalog.create_namespace("iot")
table = catalog.create_table("iot.probe", schema=pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("value", pa.float64())]))
with table.transaction() as tx:  # a commit through the REST protocol (the engine writes data files itself)
    tx.set_properties({"timelake.time-column": "ts"})
assert catalog.load_table("iot.probe").properties["timelake.time-column"] == "ts"
print("ok")
'''


def test_pyiceberg_rest_with_sigv4_runs_from_the_engine_layer(rest_server: RestServer, tmp_path: Path,
                                                            lambda_paths: Callable[[tuple[str, ...]], list[Path]]) -> None:  # noqa: F811
    props = rest_server.catalog_props("lambda", **{"rest.sigv4-enabled": "true", "rest.signing-name": "s3tables",
                                                   "rest.signing-region": "us-east-1"})
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "settings.json").write_text(json.dumps({"paths": [str(p) for p in lambda_paths(("engine",))], "props": props,
                                                        "tmp": str(tmp_path)}))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing"}
    run = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "probe.py"), str(tmp_path / "settings.json")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "ok", run.stdout[-2000:] + run.stderr[-4000:]
