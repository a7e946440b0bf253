"""Reading a live InfluxDB 1.x server: our per-day chunked reads vs the server's own output speed.

Starts influxd on loopback ports in a temp folder, writes ROWS points (100 series, 1 per second),
then times the source reading them all, as CSV (no string field) and as JSON (with one). The floor
is fetching the same query's body over HTTP without parsing it: what the server can send.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from timelake.sources.influx import InfluxServerSource

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(root: Path) -> tuple[subprocess.Popen, str]:
    http, rpc = _port(), _port()
    (root / "influxdb.conf").write_text(
        f'reporting-disabled = true\nbind-address = "127.0.0.1:{rpc}"\n[meta]\n  dir = "{root}/meta"\n'
        f'[data]\n  dir = "{root}/data"\n  wal-dir = "{root}/wal"\n  query-log-enabled = false\n'
        f'[http]\n  bind-address = "127.0.0.1:{http}"\n  log-enabled = false\n[monitor]\n  store-enabled = false\n')
    process = subprocess.Popen([shutil.which("influxd"), "-config", str(root / "influxdb.conf")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{http}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/ping", timeout=1).close()
            return process, endpoint
        except OSError:
            time.sleep(0.1)
    raise SystemExit("influxd did not start")


def _write(endpoint: str, measurement: str, text_field: bool) -> None:
    urllib.request.urlopen(f"{endpoint}/query", data=b"q=CREATE+DATABASE+bench").close()
    for start in range(0, ROWS, 100_000):
        extra = ',state="ok"' if text_field else ""
        lines = "\n".join(f"{measurement},device_id=d{i % 100} value={i * 0.5},count={i}i{extra} {1_700_000_000 + i // 100}"
                          for i in range(start, min(ROWS, start + 100_000)))
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/write?db=bench&precision=s", data=lines.encode())).close()


def _floor(endpoint: str, measurement: str, accept: str) -> float:
    query = urllib.parse.urlencode({"db": "bench", "epoch": "ns", "chunked": "true", "chunk_size": 50_000,
                                    "q": f'SELECT * FROM "{measurement}"'})
    start = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/query?{query}", headers={"Accept": accept})) as r:
        while r.read(1 << 20):
            pass
    return ROWS / (time.perf_counter() - start)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        process, endpoint = _start(Path(tmp))
        try:
            for measurement, text_field, accept in (("plain", False, "application/csv"),
                                                    ("texts", True, "application/json")):
                _write(endpoint, measurement, text_field)
                source = InfluxServerSource(f"{endpoint.replace('http', 'influx')}/bench?measurement={measurement}",
                                            None, 262_144)
                start = time.perf_counter()
                pieces = source.pieces()
                plan = time.perf_counter() - start
                start = time.perf_counter()
                rows = sum(b.data.num_rows for b in source.batches())
                ours = rows / (time.perf_counter() - start)
                assert rows == ROWS, rows
                floor = _floor(endpoint, measurement, accept)
                print(f"{ROWS:,} points, {'a string field (JSON)' if text_field else 'numbers only (CSV)'}: "
                      f"plan {plan:.2f} s for {len(pieces)} day pieces; read {ours:,.0f} points/s; "
                      f"server body alone {floor:,.0f} points/s; ratio {ours / floor:.2f}")
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
