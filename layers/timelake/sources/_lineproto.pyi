"""The compiled line-protocol reader (``_lineproto.c``) as type checkers see it; the C file's method
table documents each function."""

from typing import Any

from _typeshed import ReadableBuffer

def series_tail(chunk: ReadableBuffer, end: int, /) -> int: ...
def newlines(chunk: ReadableBuffer, /) -> int: ...
def split(
    chunk: ReadableBuffer, most_odd: int, join: bool = True, dialect: int = 1, /
) -> tuple[Any, ...] | None: ...
