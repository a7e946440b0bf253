"""Both line-protocol readers against a real influxd 1.x, the parser they follow, line by line.

Each document (edge cases written by hand, then seeded random ones built from the same pieces) is
written to a fresh database of the influxd the source tests run, one line per request in file order,
as a replay would, and read back with ``SELECT * FROM "m" GROUP BY *`` per measurement. The engine
reads the same bytes with the compiled reader and with the Arrow one, each at another chunk size, in
reject mode, so every line it refuses is named. They must agree on which lines are refused and on
every value kept (measurement, tags, time, field, type, value). Where influxd's own batch semantics
allow it (no line refused after parsing), the whole document is also written in one request, which
checks the engine's cutting of lines and its reasons against influxd's own error text.

A backfill differs from influxd on purpose in three places, and those lines are not written to it:
a line without a timestamp (influxd would use the time of the write), text that is not UTF-8, and a
key that is a tag on one line and a field on another (a table column is one or the other).
"""

from __future__ import annotations

import http.client
import json
import mmap
import random
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from tests.sources.conftest import Influx
from timelake.sources import line_protocol
from timelake.sources import lp_grammar as grammar

T = b" 1700000000000000000"
LINES = [
    # read wrongly before: separators between two quotes of a name, escapes, a leading tab
    b'm,a=x"y,b=x"y f=1' + T, b'm,t="x,y=z" f=1' + T, b'm"a,t=b"c f=1' + T, b'm a"b=1,c"d=2' + T,
    b"m,t=a\\\\b f=1" + T, b"m\\\\x f=1" + T, b"\tm f=1" + T,
    # accepted before, refused by influxd
    b"m f=inf" + T, b"m f=NaN" + T, b"m f=1e400" + T, b"m f=+1" + T, b"m f=-inf" + T, b"m f=nan" + T,
    b"m f=1 9223372036854775807", b"m f=1 9223372036854775808", b"m f=1 -9223372036854775807",
    b"m f=1 -9223372036854775808", b"m f=1 9223372036854775806", b"m f=1 -9223372036854775806",
    b"m,t= f=1" + T, b"m,t=a,t=b f=1" + T, b"m,b=1,a=2,b=3 f=1" + T, b"m,t=a=b f=1" + T, b"m,=a f=1" + T,
    b"m =1" + T, b",t=a f=1" + T, b"m f=1\\ 1700000000000000000", b"m f=1,f=2i" + T,
    # refused before, accepted by influxd
    b"m f=1" + T + b" ", b" m f=1" + T, b"m  f=1" + T, b"m f=1 " + T, b"   ", b'm s="a\nb"' + T, b"m f=1,time=2" + T,
    b"m f=1" + T + b"\t", b"m f=1\t" + T,
    # numbers
    b"m f=.5" + T, b"m f=5." + T, b"m f=-.5" + T, b"m f=." + T, b"m f=-" + T, b"m f=-." + T, b"m f=1.2.3" + T,
    b"m f=1e5" + T, b"m f=1E5" + T, b"m f=1e+5" + T, b"m f=1e-5" + T, b"m f=1e" + T, b"m f=e5" + T, b"m f=1.e5" + T,
    b"m f=.e5" + T, b"m f=1e5e5" + T, b"m f=1e+-5" + T, b"m f=-e5" + T, b"m f=1-2" + T, b"m f=1e-400" + T,
    b"m f=123456789012345678901234567890" + T, b"m f=" + b"9" * 400 + T, b"m f=0." + b"0" * 400 + b"1" + T,
    b"m f=4.9e-324" + T, b"m f=2.2250738585072011e-308" + T, b"m f=1.7976931348623157e308" + T,
    b"m f=1.7976931348623159e308" + T, b"m f=9007199254740993" + T, b"m f=0.1" + T, b"m f=-0" + T, b"m f=007" + T,
    b"m i=1i" + T, b"m i=-1i" + T, b"m i=-0i" + T, b"m i=007i" + T, b"m i=9223372036854775807i" + T,
    b"m i=9223372036854775808i" + T, b"m i=-9223372036854775808i" + T, b"m i=-9223372036854775809i" + T,
    b"m i=0000000000000000000000001i" + T, b"m i=1.5i" + T, b"m i=1e5i" + T, b"m i=-i" + T, b"m i=i" + T,
    b"m i=1i5" + T, b"m i=1ii" + T, b"m i=1iu" + T, b"m u=1u" + T, b"m u=18446744073709551615u" + T, b"m u=-1u" + T,
    b"m i=+1i" + T, b"m f=0x10" + T, b"m f=1_000" + T, b"m f=Infinity" + T, b"m f=1N" + T, b"m f=1n" + T,
    # booleans
    b"m b=t" + T, b"m b=T" + T, b"m b=true" + T, b"m b=True" + T, b"m b=TRUE" + T, b"m b=f" + T, b"m b=F" + T,
    b"m b=false" + T, b"m b=False" + T, b"m b=FALSE" + T, b"m b=tRUE" + T, b"m b=tru" + T, b"m b=yes" + T,
    b"m b=t1" + T, b'm b=t"x"' + T, b"m b=fa" + T,
    # strings
    b'm s=""' + T, b'm s="a"' + T, b'm s="a b, c=d"' + T, b'm s="a\\"b"' + T, b'm s="a\\\\"' + T, b'm s="a\\\\b"' + T,
    b'm s="a\\nb"' + T, b'm s="a\\,b"' + T, b'm s="a"b' + T, b'm s="a"b"c"' + T, b'm s="a' + T, b'm s=a"b"' + T,
    b'm s="a",t="b"' + T, b'm s="\\"' + T, b'm s="' + T, b'm s="a" ' + T, b'm s="tab\there"' + T,
    b'm s="' + "é".encode() + b'"' + T, b'm s="a\x00b"' + T,
    # names and escapes
    b"m\\ x f=1" + T, b"m\\,x f=1" + T, b"m\\=x f=1" + T, b'm\\"x f=1' + T, b"m\\x f=1" + T, b"m\\ f=1" + T,
    b"m,t\\ k=v f=1" + T, b"m,t\\=k=v f=1" + T, b"m,t\\,k=v f=1" + T, b"m,t=v\\ w f=1" + T, b"m,t=v\\,w f=1" + T,
    b"m,t=v\\=w f=1" + T, b'm,t=v\\"w f=1' + T, b"m,t=v\\\\ f=1" + T, b"m,t==x f=1" + T, b"m,t=x= f=1" + T,
    b"m f\\ g=1" + T, b"m f\\,g=1" + T, b"m f\\=g=1" + T, b'm f\\"g=1' + T, b"m f\\\\g=1" + T, b'm a\\"b=1,a"b=2' + T,
    b"m, f=1" + T, b"m,t=a, f=1" + T, b"m,t f=1" + T, b"m,t=a,,u=b f=1" + T, b"m f=1,,g=2" + T, b"m f=1," + T,
    b"m ,f=1" + T, b"m f=1,=2" + T, b"m f" + T, b"m f=1=2" + T, b"m" + T, b"m", b"m,t=a", b"m f=1 x", b"m f=1 1 2",
    b"m f=1 +1", b"m f=1 -", b"m f=1 --1", b"m f=1 1-", b"m f=1 0001", b"m f=1 -0", b"m f=1 1e3",
    b"m \t=1" + T, b"m f=1 \t1", b"m f=1\t1", b"m\tf=1" + T, b"\x00m f=1" + T, b"m f=1\x00" + T, b"m f=1 \x001",
    b"m,z=1,a=2,m=3 f=1" + T, b"m,time=x f=1" + T, b"m time=1" + T, b"m time=1,time=2i" + T, b"m f=1,time=x" + T,
    b"m time=1i,f=1" + T, b"m f=1i,f=2i" + T, b"m f=1,f=2,f=3" + T, b'm f="a",f=1' + T,
    b"# comment", b"  # comment", b"#", b"m f=1 1 # not a comment", b"\r", b"m f=1" + T + b"\r", b"m f=1\r" + T,
    b"m,k=" + b"x" * 65_530 + b" f=1" + T, b"m,k=" + b"x" * 65_520 + b" " + b"f" * 20 + b"=1" + T,
]
DOCS = [
    # lines that reach across newlines, and lines whose fate depends on earlier ones
    b'm s="a\nm f=1 1\n" 2\nm g=1 3', b'# a=1 "x\nm f=1 1\n" m g=2 2\nm h=3 3', b"m,t=a\\\nb f=1 1\nm g=2 2",
    b"m,t=a\\\n\nm g=2 2", b"m f=1 1\\\n", b"m f=1 1\nm f=2i 2\nm f=3 3", b"m f=1,f=2i 1\nm f=3i 2\nm f=4 3",
    b"m a=1,f=1,b=1,f=2i,c=1 1\nm c=1i 2\nm b=2i 3", b"m f=1 1\nm f=2i,g=1 2\nm g=2i 3",
    b"m,a=1 f=1 1\nm,b=2 f=2 2\nm f=1e300,g=-0 3", b"m f=1,f=2 1\nm f=3 1", b"m f=1 1\nn f=1i 1\nm,t=x f=2 1",
    b'm\\\\ a="x,t=1 f=1 1\nm g=1 2\n" 3\nm h=1 4', b' m=x a"b=1 1\nm f=1 2\n" 3', b'm f=1 12"3\nm g=1 2\n" 4',
    b"\n\n\nm f=1 1\n\n", b"m f=1", b'm s="tail\nstill" 5', b'm s="' + b"x" * 300 + b'\n' + b"y" * 300 + b'" 7\nm f=2 8',
    b"m,t=x f=1 1\nm t=2 2\nm,t=y t=3 3",
]
SEPARATORS = [b" ", b" ", b" ", b"  ", b"\t", b" \t"]
NAMES = ["m", "cpu", "m2", "a b", "x,y", 'q"r', "é", "t=1", "m\\", "#m", "time"]
CHARS = ["a", "b", "z", "0", " ", ",", "=", '"', "\\", "\t", "é", "#", "-", ".", "\n", "i"]
FLOATS = ["1", "-1", "0", "-0", ".5", "5.", "1e3", "1E-3", "1e400", "1.5e+2", "12345678901234567890123456", "007",
          "1.2.3", "+1", "inf", "NaN", "-", ".", "1e", "9" * 30, "0.1", "3.14159"]
INTEGERS = ["1i", "-1i", "0i", "9223372036854775807i", "9223372036854775808i", "-9223372036854775808i", "1.5i", "i",
            "-i", "1u", "18446744073709551615u"]
BOOLEANS = ["t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE", "tru", "yes"]
DOCUMENTS = 150  # seeded random documents; each has up to 25 lines
DEVIATIONS = (grammar.NO_TIMESTAMP, "is not UTF-8", line_protocol._ONE_ROLE)  # noqa: SLF001 (the reason each names)
WRITE_STAGE = ("invalid tag key", "invalid field name", "field type conflict", "unable to unmarshal", "unknown field type",
               "on an earlier line")


def _text(r: random.Random, most: int) -> str:
    return "".join(r.choice(CHARS) if r.random() < 0.3 else r.choice("abcxyz") for _ in range(r.randint(0, most)))


def _escaped(text: str, special: str) -> str:
    return "".join("\\" + c if c in special else c for c in text)


def _value(r: random.Random, key: str) -> str:
    """A value of the kind the key's name gives (one time in ten another), spelled plainly or oddly."""
    kind = r.choice("ffffiisb") if r.random() < 0.1 else "fisb"[sum(key.encode()) % 4]
    if kind == "f":
        return r.choice(FLOATS) if r.random() < 0.3 else repr(round(r.uniform(-1e6, 1e6), r.randint(0, 6)))
    if kind == "i":
        return r.choice(INTEGERS) if r.random() < 0.3 else f"{r.randint(-2**63, 2**63 - 1)}i"
    if kind == "b":
        return r.choice(BOOLEANS)
    text = _text(r, 8)
    if r.random() < 0.7:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text + '"'


def _line(r: random.Random) -> str:
    if r.random() < 0.03:
        return r.choice(["", " ", "# c", "\t", '  # x=1 "y'])
    name = r.choice(NAMES) if r.random() < 0.2 else r.choice(["m", "m", "cpu"])
    name = _escaped(name, ", ") if r.random() < 0.8 else name
    tags = []
    for _ in range(r.choice([0, 0, 1, 1, 2, 3])):
        key = r.choice(["host", "region", "t", "a b", "time", "x=y", ""]) if r.random() < 0.15 else \
            r.choice(["host", "region", "dc"])
        value = _text(r, 5) if r.random() < 0.2 else r.choice(["a", "b", "north wing", "c,d"])
        if r.random() < 0.85:
            key, value = _escaped(key, ", ="), _escaped(value, ", =")
        tags.append(f"{key}={value}")
    fields = []
    for _ in range(r.choice([1, 1, 2, 3, 4])):
        key = r.choice(["f", "g", "h", "s", "time", "a b", 'q"', "v=1", ""]) if r.random() < 0.1 else \
            r.choice(["f", "g", "h", "s"])
        key = _escaped(key, ", =") if r.random() < 0.85 else key
        fields.append(f"{key}={_value(r, key)}")
    stamp = str(1_700_000_000_000_000_000 + r.randint(0, 10**12))
    if r.random() < 0.05:  # far from the others, in a shard of its own: a measurement of its own
        stamp = r.choice(["", "-1", "9223372036854775807", "9223372036854775806", "1e3", "+5", "12x", "1 2", "0"])
        name = "edge"

    def gap() -> str:
        return r.choice(SEPARATORS).decode() if r.random() < 0.1 else " "

    line = ",".join([name, *tags]) + gap() + ",".join(fields) + (gap() + stamp if stamp else "")
    if r.random() < 0.05:
        line = r.choice([" ", "\t", ""]) + line + r.choice([" ", "", "\t", "\\"])
    return line


def document(seed: int) -> bytes:
    r = random.Random(seed)
    return "\n".join(_line(r) for _ in range(r.randint(1, 25))).encode()


class Oracle:
    """influxd over one kept-alive HTTP connection: writes, and every point stored as typed values."""

    def __init__(self, influx: Influx) -> None:
        url = urllib.parse.urlsplit(influx.endpoint)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)

    def _post(self, path: str, body: bytes = b"") -> tuple[int, str]:
        self.connection.request("POST", path, body=body)
        response = self.connection.getresponse()
        return response.status, response.read().decode(errors="replace")

    def query(self, q: str, db: str | None = None) -> dict:
        params = {"q": q, "epoch": "ns", **({"db": db} if db else {})}
        status, text = self._post("/query?" + urllib.parse.urlencode(params))
        assert status == 200, text
        return json.loads(text)["results"][0]

    def write(self, db: str, body: bytes) -> tuple[int, str]:
        return self._post(f"/write?db={db}&precision=ns", body)

    def points(self, db: str) -> set[tuple]:
        """(measurement, tags, time, field, type, value) of every stored value; each measurement is asked
        on its own (a query over several merges fields of one name and drops values of the other type)."""
        types = {(series["name"], key): kind for series in self.query("SHOW FIELD KEYS", db).get("series", [])
                 for key, kind in series["values"]}
        found = set()
        for series in self.query("SHOW MEASUREMENTS", db).get("series", []):
            for (name,) in series["values"]:
                quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
                for rows in self.query(f"SELECT * FROM {quoted} GROUP BY *", db).get("series", []):
                    tags = tuple(sorted((k, v) for k, v in (rows.get("tags") or {}).items() if v != ""))
                    for row in rows["values"]:
                        for column, value in zip(rows["columns"][1:], row[1:], strict=True):
                            if value is None:
                                continue
                            key = column if (name, column) in types else ""  # an empty field name comes back as val0
                            kind = types[(name, key)]
                            found.add((name, tags, row[0], key, kind, float(value) if kind == "float" else value))
        return found


@dataclass
class Reading:
    points: set[tuple]
    refused: dict[int, tuple[str, bytes]]  # line -> reason, text


def engine(path: Path, chunk: int, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> Reading:
    """Every measurement of the file read by one reader, rejecting: its values and the lines it refused."""
    with monkeypatch.context() as patch:
        patch.setattr(line_protocol, "_CHUNK_BYTES", chunk)
        if not compiled:
            patch.setattr(line_protocol, "_lineproto", None)
        refused: dict[int, tuple[str, bytes]] = {}
        found = set()
        names, done = ["m"], set()  # the first read names every measurement of the file
        while names:
            name = names.pop()
            done.add(name)
            parser, batches = _read(path, name, refused)
            names = sorted(parser.seen - done) if len(done) == 1 else names
            for batch in batches:
                table = pa.Table.from_batches([batch])
                fields = [f for f in table.schema if f.name not in (line_protocol.TIME, line_protocol.LINE,
                                                                   line_protocol.SERIES, line_protocol.BLOCK)
                          and f.name not in parser.tags]
                for row in table.to_pylist():
                    tags = tuple(sorted((k, row[k]) for k in parser.tags if row.get(k) is not None))
                    stamp = int(row[line_protocol.TIME].value)
                    for f in fields:
                        if row[f.name] is not None:
                            kind = next(k for k, t in line_protocol.ARROW_TYPES.items() if t == f.type)
                            found.add((name, tags, stamp, f.name, kind, row[f.name]))
    return Reading(found, refused)


def _read(path: Path, measurement: str, refused: dict) -> tuple[line_protocol.LineProtocol, list[pa.RecordBatch]]:
    """One measurement read as a backfill reads a local file (through a memory map), rejecting."""
    parser = line_protocol.LineProtocol(measurement, "ns", str(path), reject=True,
                                        noted=lambda line, reason, text: refused.setdefault(line, (reason, text)))
    if not path.stat().st_size:
        return parser, []
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return parser, list(line_protocol.points(parser, parser.batches(mapped), 100_000))


def lines_of(doc: bytes) -> list[tuple[int, bytes]]:
    """The lines influxd parses, by number (blank lines, comments and export DDL left out)."""
    found, start, number = [], 0, 1
    while start < len(doc):
        end = grammar.line_end(doc, start, len(doc), True)
        block = doc[start:end]
        if grammar.content(block) is not None and not block.startswith((b"CREATE DATABASE ", b"CREATE RETENTION POLICY ")):
            found.append((number, block))
        number += block.count(b"\n") + 1
        start = end + 1
    return found


def differences(oracle: Oracle, doc: bytes, reading: Reading) -> tuple[list, bool]:
    """Where influxd, sent the document a line at a time, disagrees with the engine's reading; and
    whether the whole document in one write could be checked too (then its differences are listed)."""
    found = []
    db = "lp" + uuid.uuid4().hex[:12]
    oracle.query(f'CREATE DATABASE "{db}"')
    try:
        for number, block in lines_of(doc):
            reason = reading.refused.get(number, (None,))[0]
            if reason is not None and any(mark in reason for mark in DEVIATIONS):
                continue  # refused on purpose; influxd would take it
            status, text = oracle.write(db, block)
            if (status == 204) != (reason is None):
                found.append((number, block[:120], reason, status, text.strip()[:200]))
        stored = oracle.points(db)
    finally:
        oracle.query(f'DROP DATABASE "{db}"')
    if stored != reading.points:
        found.append(("values", sorted(stored - reading.points, key=repr)[:4], sorted(reading.points - stored, key=repr)[:4]))
    reasons = [reason for reason, _ in reading.refused.values()]
    if any(mark in reason for reason in reasons for mark in (*DEVIATIONS, *WRITE_STAGE)):
        return found, False
    kinds: dict[tuple, str] = {}
    if any(kinds.setdefault((m, f), k) != k for m, _, _, f, k, _ in reading.points):
        return found, False  # a field of two types in one batch fails influxd's whole write
    refused = [f"unable to parse '{text.decode()}': {reason}" for _, (reason, text) in sorted(reading.refused.items())]
    message = "\n".join(refused)
    if refused and reading.points:
        message = f"partial write: {message} dropped=0"
    db = "lp" + uuid.uuid4().hex[:12]
    oracle.query(f'CREATE DATABASE "{db}"')
    try:
        status, text = oracle.write(db, doc)
        stored = oracle.points(db)
    finally:
        oracle.query(f'DROP DATABASE "{db}"')
    got = (status, json.loads(text)["error"] if text else "")
    if got != ((400, message) if refused else (204, "")):
        found.append(("whole document", got, message[:300]))
    if stored != reading.points:
        found.append(("whole document values", sorted(stored - reading.points, key=repr)[:4]))
    return found, True


def test_both_readers_read_as_influxd_writes(influxd: Influx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.perf_counter()
    oracle = Oracle(influxd)
    docs = [b"\n".join(LINES), *DOCS, *(document(seed) for seed in range(DOCUMENTS))]
    path = tmp_path / "doc.lp"
    problems, whole, values, refusals = [], 0, 0, 0
    for index, doc in enumerate(docs):
        path.write_bytes(doc)
        small = 61 + index % 50  # chunks cut inside lines that reach across newlines, and between them
        compiled = engine(path, small if index % 2 else 1 << 20, True, monkeypatch)
        arrow = engine(path, 1 << 20 if index % 2 else small, False, monkeypatch)
        if (compiled.points, compiled.refused) != (arrow.points, arrow.refused):
            problems.append((index, "readers differ", sorted(compiled.points ^ arrow.points, key=repr)[:3],
                             sorted(set(compiled.refused.items()) ^ set(arrow.refused.items()))[:3]))
            continue
        found, checked = differences(oracle, doc, compiled)
        whole += checked
        values += len(compiled.points)
        refusals += len(compiled.refused)
        if found:
            problems.append((index, doc[:200], found[:4]))
    print(f"{len(docs)} documents, {values} values, {refusals} lines refused, {whole} also written whole: "
          f"{len(problems)} with differences, {time.perf_counter() - started:.1f} s")
    assert not problems, problems[:5]
    assert whole > len(docs) // 3 and values > 1_000 and refusals > 500
