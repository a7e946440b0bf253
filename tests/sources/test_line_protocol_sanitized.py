"""The compiled line-protocol reader built with AddressSanitizer and UndefinedBehaviorSanitizer, fuzzed.

The test compiles ``_lineproto.c`` as the install does, plus the sanitizers, and runs a bounded
hypothesis search in a child interpreter that loads the ASan runtime first (it must come before any
other library): raw bytes, documents built from the pieces line protocol is made of (quotes,
escapes, newlines inside values, NULs, bytes past ASCII, long keys, lines of thousands of fields),
each cut by ``split`` in every mode (and the documents read whole by ``LineProtocol`` in small
chunks, which hands the module's buffers to numpy and Arrow). Any report of
either sanitizer stops the child with an error; a hang is the child's timeout.
"""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sanitized import ROOT, load, run_sanitized

SOURCE = ROOT / "layers" / "timelake" / "sources" / "_lineproto.c"
EXAMPLES = 200  # per search, in the child; two searches
KNOWN = [b'm s="" 1\n', b'm s="",t="" 1\nm s="" 2', b"m f=1 1\n" * 3]  # found before: a copy of no bytes from no buffer
PIECES = [b"m", b"cpu", b",", b"=", b" ", b" ", b'"', b"\\", b"\n", b"\t", b"\x00", b"\x01", b"\r", b"#", b"i", b"u",
          b"t", b"1", b"-", b".", b"e", b"9223372036854775808", b"1.5", b"\xc3\xa9", b"\xff", b"time", b"f=1", b",t=a",
          b" 1700000000000000000", b'="a b"', b"x" * 70]


def test_compiled_reader_is_clean_under_both_sanitizers(tmp_path: Path) -> None:
    started = time.perf_counter()
    printed = run_sanitized(SOURCE, tmp_path, "tests.sources.test_line_protocol_sanitized:fuzz", timeout=600)
    inputs = int(printed.split()[-1])
    print(f"{inputs} inputs under ASan and UBSan in {time.perf_counter() - started:.1f} s")
    assert inputs >= 2 * EXAMPLES + len(KNOWN)


def fuzz(library: str) -> None:
    """In the sanitized child: the searches, then the number of inputs tried (the parent checks it)."""
    import pyarrow as pa

    from timelake.sources import line_protocol

    sanitized = load(library, "_lineproto")
    line_protocol._lineproto = sanitized
    line_protocol._CHUNK_BYTES = 251  # many chunks: tails handed on, chunks cut inside values
    tried = [0]

    def cut(data: bytes, whole: bool) -> None:
        tried[0] += 1
        for join in (True, False):
            for dialect in (1, 2):
                sanitized.split(data, 1 << 40, join, dialect)
        sanitized.split(data, 2, True, 1)
        sanitized.newlines(data)
        block = bytearray(data)
        for end in {len(block), block.rfind(b"\n") + 1}:
            if end:
                sanitized.series_tail(block, end)
        if whole:
            parser = line_protocol.LineProtocol("m", "ns", "fuzz", 1 + tried[0] % 2, reject=True)
            for _ in line_protocol.points(parser, parser.batches(pa.BufferReader(data)), 1_000):
                pass

    quiet = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                     suppress_health_check=list(HealthCheck))
    pieces = st.lists(st.sampled_from(PIECES), max_size=30).map(b"".join)
    wide = st.integers(60, 600).map(lambda n: b"m " + b",".join(b"f%d=%di" % (i, i) for i in range(n)) + b" 1")
    documents = st.lists(st.integers(0, 9).flatmap(lambda pick: wide if pick == 0 else pieces), max_size=12).map(b"\n".join)
    for known in KNOWN:  # first, while the module's buffer pool is empty (a chunk then gets no buffer of its own)
        cut(known, whole=True)
    quiet(given(documents)(lambda data: cut(data, whole=True)))()
    quiet(given(st.binary(max_size=3_000))(lambda data: cut(data, whole=False)))()
    print(tried[0])
