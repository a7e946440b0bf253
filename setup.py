"""The package's one compiled part; everything else is declared in pyproject.toml.

The line-protocol reader's inner loop is C (``layers/timelake/sources/_lineproto.c``). It is
optional: without a compiler the install still succeeds, and the reader uses Arrow kernels alone.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("timelake.sources._lineproto", ["layers/timelake/sources/_lineproto.c"],
                             extra_compile_args=["-O2"], optional=True)])
