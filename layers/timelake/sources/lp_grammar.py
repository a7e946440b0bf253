"""InfluxDB line protocol as influxd reads it, one line at a time: the reference for the faster paths.

A port of the parser of InfluxDB 1.6 (``models/points.go``: ``ParsePointsWithPrecision``,
``scanLine``, ``parsePoint`` and the field iterator that reads the values back) and of what its
write path adds (``tsdb/shard.go`` and the field validator): a point with a tag named ``time`` is
dropped, a field named ``time`` is ignored, and a field given two types in one point is refused.
The same scans in the same order give the same verdict and the same reason, so a line is refused
here exactly when influxd refuses it, and read to the same values when it accepts it. Dialect 2 is
InfluxDB 2.x (2.7), whose parser differs in two places: unsigned integers (``1u``) are values, and
the tag keys ``_measurement``, ``_field`` and ``time`` are refused while parsing.

Where a backfill must differ, it says so with its own reason: a line without a timestamp (influxd
stamps it with the time of the write, which means nothing for history) and text that is not UTF-8
(a table's strings are). The compiled reader and the Arrow paths of ``line_protocol`` read the
plain lines themselves and set every other line aside for this module, so it only has to be exact,
not fast.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

MIN_NS = -(2**63) + 2  # influxd keeps the two lowest and the highest nanosecond for itself
MAX_NS = 2**63 - 2
MAX_KEY = 65_535
FLOAT, STRING, INTEGER, UNSIGNED, BOOLEAN = range(5)  # the kinds, numbered as the compiled reader numbers them
KINDS = ("float", "string", "integer", "unsigned", "boolean")
NO_TIMESTAMP = "no timestamp (influxd would stamp the point with the time of the write)"
_WHITESPACE = b" \t\x00"
_ESCAPES = b',"= '
_NUMERIC = b"0123456789."
_TYPED = b"0123456789-.nNiIu"
_BOOLEANS = {b"t": True, b"T": True, b"true": True, b"True": True, b"TRUE": True,
             b"f": False, b"F": False, b"false": False, b"False": False, b"FALSE": False}
_RESERVED_TAGS = (b"_field", b"_measurement", b"time")  # refused by the 2.x parser


class Point(NamedTuple):
    """A line read: tags sorted by key, and each field's kind and value (the last of a key given twice).

    ``error`` is set when influxd's write path refuses the point after it has accepted its fields'
    types: a field given two types in the point, or a value it cannot read back. Such a point still
    creates the fields before the failure (``cells``: each field of the line in order, key and kind),
    which decides whether later points of those fields are refused, so the caller keeps it for that.
    """

    measurement: str
    tags: tuple[tuple[str, str], ...]
    fields: dict[str, tuple[int, object]]
    time: int
    cells: tuple[tuple[str, int | None], ...] = ()
    error: str | None = None


class _Refused(Exception):
    """Why influxd refuses the line, in its own words."""


def line_end(buf: bytes | bytearray | memoryview, start: int, end: int, final: bool) -> int | None:
    """Where the line that begins at ``start`` ends (its newline, or ``end``), as influxd's ``scanLine``
    cuts a request body: a newline inside a quoted field value, or after a backslash, is part of the
    line. None when the line may go on past ``end`` and ``final`` is false (more of the file follows)."""
    i, quoted, fields, equals, commas = start, False, False, 0, 0
    while i < end:
        c = buf[i]
        if c == 92:  # a backslash: the byte after it is skipped, unless it is one of the body's last two
            if i + 2 < end:
                i += 2
                continue
            if not final:
                return None
        if c == 32:
            fields = True
        if fields:
            if not quoted and c == 61:
                equals += 1
                i += 1
                continue
            if not quoted and c == 44:
                commas += 1
                i += 1
                continue
            if c == 34 and equals > commas:
                quoted = not quoted
                i += 1
                continue
        if c == 10 and not quoted:
            return i
        i += 1
    return end if final else None


def content(block: bytes) -> bytes | None:
    """What influxd parses of a line: None for a blank line or a comment, else the line without its
    leading spaces, tabs and NULs (and without a newline it ended on, which only an escape leaves)."""
    start = 0
    while start < len(block) and block[start] in _WHITESPACE:
        start += 1
    if start >= len(block) or block[start] == 35:
        return None
    if block[-1] == 10:
        block = block[:-1]
    return block[start:]


def read_line(line: bytes, scale: int = 1, dialect: int = 1) -> Point | str:
    """The point of one line (as ``content`` gives it), or why influxd refuses it; times are nanoseconds
    (the line's integer times ``scale``)."""
    try:
        return _point(line, scale, dialect)
    except _Refused as e:
        return str(e)


def read_key(key: bytes, dialect: int = 1) -> tuple[str, tuple[tuple[str, str], ...]] | str:
    """Measurement and sorted tags of a series key (a line's text up to the first space no backslash
    precedes), or why influxd refuses every line that begins with it."""
    try:
        _, key = _scan_key(key + b" ", dialect)
        if len(key) > MAX_KEY:
            raise _Refused(f"max key length exceeded: {len(key)} > {MAX_KEY}")
        measurement, tags = _name_and_tags(key)
        _time_tag(measurement, tags, dialect)
        return measurement, tags
    except _Refused as e:
        return str(e)


def _point(buf: bytes, scale: int, dialect: int) -> Point:
    pos, key = _scan_key(buf, dialect)
    if not key:
        raise _Refused("missing measurement")
    if len(key) > MAX_KEY:
        raise _Refused(f"max key length exceeded: {len(key)} > {MAX_KEY}")
    pos, fields = _scan_fields(buf, pos, dialect)
    if not fields:
        raise _Refused("missing fields")
    _check_key_sizes(key, fields)
    pos, stamp = _scan_time(buf, pos)
    if not stamp:
        raise _Refused(NO_TIMESTAMP)
    if stamp == b"-":
        raise _Refused('strconv.ParseInt: parsing "-": invalid syntax')
    value = int(stamp)
    if not -(2**63) <= value < 2**63:
        raise _Refused(f'strconv.ParseInt: parsing "{_text(stamp)}": value out of range')
    ns = value * scale
    if not MIN_NS <= ns <= MAX_NS:
        raise _Refused(f"time outside range {MIN_NS} - {MAX_NS}")
    if buf[pos:].strip(b" "):
        raise _Refused("point is invalid")
    measurement, tags = _name_and_tags(key)
    _time_tag(measurement, tags, dialect)
    return _fields(measurement, tags, fields, ns)


def _time_tag(measurement: str, tags: tuple[tuple[str, str], ...], dialect: int) -> None:
    if dialect == 1 and any(key == "time" for key, _ in tags):
        raise _Refused(f'invalid tag key: input tag "time" on measurement "{measurement}" is invalid')


def _name_and_tags(key: bytes) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The measurement (``escape.Unescape`` of the key up to its first unescaped comma) and the tags
    (``walkTags``: keys and values with ``\\,``, ``\\ `` and ``\\=`` unescaped), as the index stores them."""
    end = _scan_to(key, 0, 44)
    measurement = _decode(_unescape(key[:end]), "measurement")
    tags = []
    i = end + 1
    while i < len(key):
        start = i
        i = _scan_to(key, i, 61)
        name = key[start:i]
        i += 1
        begin = i
        while i < len(key) and not (key[i] == 44 and key[i - 1] != 92):
            i += 1
        if i > begin:
            tags.append((_decode(_unescape_tag(name), "tag key"), _decode(_unescape_tag(key[begin:i]), "tag value")))
            i += 1
    return measurement, tuple(sorted(tags))


def _fields(measurement: str, tags: tuple[tuple[str, str], ...], fields: bytes, ns: int) -> Point:
    """The fields as the iterator of influxd's write path reads them back, ``time`` skipped; a point
    with only ``time`` is refused, and one influxd fails to write (``Point.error``) is marked."""
    cells: list[tuple[str, int | None, bytes]] = []
    end = 0
    while end < len(fields):
        start = end
        end = _scan_to(fields, start, 61)
        key = _decode(_unescape(fields[start:end]), "field key")
        end, raw = _scan_field_value(fields, end + 1)
        end += 1
        if key != "time":
            cells.append((key, _kind(raw), raw))
    if not cells:
        raise _Refused(f'invalid field name: input field "time" on measurement "{measurement}" is invalid')
    kinds = tuple((key, kind) for key, kind, _ in cells)
    found: dict[str, tuple[int, object]] = {}
    first: dict[str, int | None] = {}
    for key, kind, _ in cells:
        if kind is not None and first.setdefault(key, kind) != kind:
            return Point(measurement, tags, {}, ns, kinds, "field type conflict")
    for key, kind, raw in cells:
        if kind is None:
            return Point(measurement, tags, {}, ns, kinds, f"unknown field type for {key}")
        try:
            found[key] = (kind, _value(kind, raw, key))
        except _Refused as e:
            return Point(measurement, tags, {}, ns, kinds, str(e))
    return Point(measurement, tags, found, ns)


def _kind(raw: bytes) -> int | None:
    """The type the field iterator gives a value by its first and last byte (None: empty, no type)."""
    if not raw:
        return None
    if raw[0] == 34:
        return STRING
    if raw[0] in _TYPED:
        return INTEGER if raw[-1] == 105 else UNSIGNED if raw[-1] == 117 else FLOAT
    return BOOLEAN


def _value(kind: int, raw: bytes, key: str) -> object:
    if kind == STRING:
        return _decode(_unescape_string(raw[1:-1]), "string value")
    if kind == INTEGER:
        return _go_int(raw[:-1], signed=True, what=f"unable to unmarshal field {key}: unable to parse integer value")
    if kind == UNSIGNED:
        return _go_int(raw[:-1], signed=False, what=f"unable to unmarshal field {key}: unable to parse unsigned value")
    if kind == FLOAT:
        value = _go_float(raw)
        if value is None:
            raise _Refused(f'unable to unmarshal field {key}: unable to parse floating point value "{_text(raw)}"')
        return value
    if raw not in _BOOLEANS:
        raise _Refused(f'unable to unmarshal field {key}: unable to parse bool value "{_text(raw)}"')
    return _BOOLEANS[raw]


def _go_int(text: bytes, signed: bool, what: str) -> int:
    """``strconv.ParseInt`` / ``ParseUint`` in base 10."""
    body = text[1:] if signed and text[:1] in (b"-", b"+") else text
    name = "ParseInt" if signed else "ParseUint"
    if not body.isdigit():
        raise _Refused(f'{what}: strconv.{name}: parsing "{_text(text)}": invalid syntax')
    value = int(text)
    if not ((-(2**63) <= value < 2**63) if signed else (0 <= value < 2**64)):
        raise _Refused(f'{what}: strconv.{name}: parsing "{_text(text)}": value out of range')
    return value


_GO_FLOAT = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _go_float(text: bytes) -> float | None:
    """``strconv.ParseFloat(text, 64)`` for decimal text: None where Go fails, which includes a value
    beyond the largest double (a value below the smallest is 0, as in Go)."""
    if _GO_FLOAT.fullmatch(text) is None:
        return None
    value = float(text)
    return None if math.isinf(value) else value


def _scan_key(buf: bytes, dialect: int) -> tuple[int, bytes]:
    """``scanKey``: the end of the series key and its text, tags sorted by key when they were not; refuses
    a malformed key and a tag key given twice."""
    start = i = _skip_whitespace(buf, 0)
    state, i = _scan_measurement(buf, i)
    indices: list[int] = []
    if state == "tag":
        i = _scan_tags(buf, i, indices)
    commas = len(indices) - 1 if indices else 0
    if dialect == 2:
        for j in range(commas):
            tag = buf[indices[j]:indices[j + 1] - 1]
            key = tag[:_scan_to(tag, 0, 61)]
            if key in _RESERVED_TAGS:
                raise _Refused(f'cannot use reserved tag key "{_text(key)}"')
    ordered = True
    for j in range(commas - 1):
        left = buf[indices[j]:indices[j + 1] - 1]
        right = buf[indices[j + 1]:indices[j + 2] - 1]
        left, right = left[:_scan_to(left, 0, 61)], right[:_scan_to(right, 0, 61)]
        if left > right:
            ordered = False
            break
        if left == right:
            raise _Refused("duplicate tags")
    if not ordered and commas > 0:
        measurement = buf[start:indices[0] - 1]
        tags = sorted(indices[:commas], key=lambda at: buf[at:_scan_to(buf, at, 61)])
        rebuilt = bytearray(measurement)
        for at in tags:
            rebuilt += b"," + buf[at:_scan_to_space_or(buf, at, 44)]
        names = [buf[at:_scan_to(buf, at, 61)] for at in tags]
        if any(a == b for a, b in zip(names, names[1:], strict=False)):
            raise _Refused("duplicate tags")
        return i, bytes(rebuilt)
    return i, buf[start:i]


def _scan_measurement(buf: bytes, i: int) -> tuple[str, int]:
    if i >= len(buf) or buf[i] == 44:
        raise _Refused("missing measurement")
    while True:
        i += 1
        if i >= len(buf):
            raise _Refused("missing fields")
        if buf[i - 1] == 92:
            continue
        if buf[i] == 44:
            return "tag", i + 1
        if buf[i] == 32:
            return "fields", i


def _scan_tags(buf: bytes, i: int, indices: list[int]) -> int:
    """``scanTags``: ``indices`` gets where each tag begins, then one past the space that ends the key."""
    while True:
        indices.append(i)
        i = _scan_tag_key(buf, i)
        more, i = _scan_tag_value(buf, i)
        if not more:
            indices.append(i + 1)
            return i


def _scan_tag_key(buf: bytes, i: int) -> int:
    if i >= len(buf) or buf[i] in b" ,=":
        raise _Refused("missing tag key")
    while True:
        i += 1
        if i >= len(buf) or (buf[i] in b" ," and buf[i - 1] != 92):
            raise _Refused("missing tag value")
        if buf[i] == 61 and buf[i - 1] != 92:
            return i + 1


def _scan_tag_value(buf: bytes, i: int) -> tuple[bool, int]:
    if i >= len(buf) or buf[i] in b", ":
        raise _Refused("missing tag value")
    while True:
        i += 1
        if i >= len(buf):
            raise _Refused("missing fields")
        if buf[i] == 61 and buf[i - 1] != 92:
            raise _Refused("invalid tag format")
        if buf[i] == 44 and buf[i - 1] != 92:
            return True, i + 1
        if buf[i] == 32 and buf[i - 1] != 92:
            return False, i


def _scan_fields(buf: bytes, i: int, dialect: int) -> tuple[int, bytes]:
    """``scanFields``: the end of the field set and its text; refuses a malformed one (each value is
    checked by ``_scan_number`` or ``_scan_boolean``, strings only for their closing quote)."""
    start = i = _skip_whitespace(buf, i)
    quoted, equals, commas = False, 0, 0
    while i < len(buf):
        c = buf[i]
        if c == 92 and i + 1 < len(buf):
            i += 2
            continue
        if c == 34 and equals > commas:
            quoted = not quoted
            i += 1
            continue
        if c == 61 and not quoted:
            equals += 1
            if buf[i - 1] in b" ," and buf[i - 2] != 92:
                raise _Refused("missing field key")
            if i + 1 >= len(buf) or buf[i + 1] in b", ":
                raise _Refused("missing field value")
            after = buf[i + 1]
            if after in _NUMERIC or after in b"-Nn":
                i = _scan_number(buf, i + 1, dialect)
                continue
            if after != 34:
                i = _scan_boolean(buf, i + 1)
                continue
        if c == 44 and not quoted:
            commas += 1
        if c == 32 and not quoted:
            break
        i += 1
    if quoted:
        raise _Refused("unbalanced quotes")
    if equals == 0 or commas != equals - 1:
        raise _Refused("invalid field format")
    return i, buf[start:i]


def _scan_number(buf: bytes, i: int, dialect: int) -> int:
    """``scanNumber``: the end of a numeric value, refusing a malformed one and, where influxd parses
    it already (long or in scientific notation), one out of its type's range."""
    start = i
    is_int = is_unsigned = decimal = scientific = False
    if i < len(buf) and buf[i] == 45:
        i += 1
        if i == len(buf):
            raise _Refused("invalid number")
    while i < len(buf):
        c = buf[i]
        if c in b", ":
            break
        if c == 105 and i > start and not (is_int or is_unsigned):
            is_int = True
            i += 1
            continue
        if c == 117 and i > start and not (is_int or is_unsigned):
            is_unsigned = True
            i += 1
            continue
        if c == 46:
            if decimal:
                raise _Refused("invalid number")
            decimal = True
        if i > start and c in b"eE":
            scientific = True
            i += 1
            continue
        if c in b"+-" and buf[i - 1] in b"eE":
            i += 1
            continue
        if i + 2 < len(buf) and c in b"Nn":
            raise _Refused("invalid number")
        if c not in _NUMERIC:
            raise _Refused("invalid number")
        i += 1
    if (is_int or is_unsigned) and (decimal or scientific):
        raise _Refused("invalid number")
    digits = i - start - is_int - decimal - (buf[start] == 45)
    if digits == 0:
        raise _Refused("invalid number")
    text = buf[start:i]
    if is_int:
        if buf[i - 1] != 105:
            raise _Refused("invalid number")
        if len(text) - 1 >= 19:
            _go_int(text[:-1], signed=True, what=f"unable to parse integer {_text(text[:-1])}")
    elif is_unsigned:
        if dialect == 1 or buf[i - 1] != 117 or buf[start] == 45:
            raise _Refused("invalid number")
        if len(text) - 1 >= 20:
            _go_int(text[:-1], signed=False, what=f"unable to parse unsigned {_text(text[:-1])}")
    elif (scientific or len(text) >= 25) and _go_float(text) is None:
        raise _Refused("invalid float")
    return i


def _scan_boolean(buf: bytes, i: int) -> int:
    start = i
    if i < len(buf) and buf[i] not in b"tfTF":
        raise _Refused("invalid boolean")
    i += 1
    while i < len(buf) and buf[i] not in b", ":
        i += 1
    if i - start == 1:
        return i
    if buf[start:i] not in (b"true", b"True", b"TRUE", b"false", b"False", b"FALSE"):
        raise _Refused("invalid boolean")
    return i


def _scan_time(buf: bytes, i: int) -> tuple[int, bytes]:
    start = i = _skip_whitespace(buf, i)
    while i < len(buf):
        c = buf[i]
        if c in b"\n ":
            break
        if i == start and c == 45:
            i += 1
            continue
        if not 48 <= c <= 57:
            raise _Refused("bad timestamp")
        i += 1
    return i, buf[start:i]


def _check_key_sizes(key: bytes, fields: bytes) -> None:
    """``walkFields`` over the field set: refuses a key and field name longer than influxd stores."""
    rest = fields
    while rest:
        i = _scan_to(rest, 0, 61)
        name = rest[:i]
        if i > len(rest) - 2:
            raise _Refused(f"invalid value: field-key={_text(name)}")
        rest = rest[i + 1:]
        i, _ = _scan_field_value(rest, 0)
        rest = rest[i:]
        if len(key) + 4 + len(name) > MAX_KEY:
            raise _Refused(f"max key length exceeded: {len(key) + 4 + len(name)} > {MAX_KEY}")
        rest = rest[1:]


def _scan_field_value(buf: bytes, i: int) -> tuple[int, bytes]:
    """``scanFieldValue``: a value ends at the first comma outside double quotes (``\\"`` and ``\\\\`` skipped)."""
    start, quoted = i, False
    while i < len(buf):
        c = buf[i]
        if c == 92 and i + 1 < len(buf) and buf[i + 1] in b'"\\':
            i += 2
            continue
        if c == 34:
            quoted = not quoted
        elif c == 44 and not quoted:
            break
        i += 1
    return i, buf[start:i]


def _scan_to(buf: bytes, i: int, stop: int) -> int:
    """``scanTo``: the first ``stop`` byte from ``i`` that no backslash precedes, else the end."""
    while i < len(buf):
        if buf[i] == stop and (i == 0 or buf[i - 1] != 92):
            return i
        i += 1
    return i


def _scan_to_space_or(buf: bytes, i: int, stop: int) -> int:
    if buf[i] in (stop, 32):
        return i
    while True:
        i += 1
        if buf[i - 1] == 92:
            continue
        if i >= len(buf) or buf[i] in (stop, 32):
            return i


def _skip_whitespace(buf: bytes, i: int) -> int:
    while i < len(buf) and buf[i] in _WHITESPACE:
        i += 1
    return i


def _unescape(raw: bytes) -> bytes:
    """``escape.Unescape``: a backslash before a comma, quote, space or equal sign is dropped."""
    if 92 not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 92 and i + 1 < len(raw) and raw[i + 1] in _ESCAPES:
            out.append(raw[i + 1])
            i += 2
            continue
        out.append(raw[i])
        i += 1
    return bytes(out)


def _unescape_tag(raw: bytes) -> bytes:
    """``unescapeTag``: ``\\,``, ``\\ `` and ``\\=`` replaced in turn (a quote keeps its backslash)."""
    if 92 not in raw:
        return raw
    return raw.replace(b"\\,", b",").replace(b"\\ ", b" ").replace(b"\\=", b"=")


def _unescape_string(raw: bytes) -> bytes:
    """``unescapeStringField``: ``\\\\`` and ``\\"`` read as one character, left to right."""
    if 92 not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 92 and i + 1 < len(raw) and raw[i + 1] in b'\\"':
            out.append(raw[i + 1])
            i += 2
            continue
        out.append(raw[i])
        i += 1
    return bytes(out)


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise _Refused(f"the {what} is not UTF-8 text (byte {e.start + 1} of {_text(raw)!r})") from None


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace")
