"""The compiled search for runs of one time bucket and series, and their rows laid end to end (``_runs.c``), as
type checkers see it."""

import numpy as np

def runs(times: np.ndarray, width: int, series: np.ndarray | None, out: np.ndarray, limit: int, /) -> tuple[int, int, int]: ...
def ranges(starts: np.ndarray, sizes: np.ndarray, out: np.ndarray, /) -> np.ndarray: ...
