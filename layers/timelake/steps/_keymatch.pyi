"""The compiled key packing and walk over two sorted key arrays (``_keymatch.c``) as type checkers see it."""

import numpy as np

def pack(codes: np.ndarray, times: np.ndarray, base: int, time_bits: int, out: np.ndarray,
         lookup: np.ndarray | None = None, /) -> int: ...
def mark(mine: np.ndarray, theirs: np.ndarray, mask: np.ndarray, /) -> int: ...
