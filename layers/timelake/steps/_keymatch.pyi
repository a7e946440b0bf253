"""The compiled walk over two sorted key arrays (``_keymatch.c``) as type checkers see it."""

import numpy as np

def mark(mine: np.ndarray, theirs: np.ndarray, mask: np.ndarray, /) -> int: ...
