"""The package's compiled parts; everything else is declared in pyproject.toml.

The line-protocol reader's inner loop (``layers/timelake/sources/_lineproto.c``) and merge mode's key
packing and walk over two sorted key arrays (``layers/timelake/steps/_keymatch.c``) are C. Both are optional: without a
compiler the install still succeeds, and the engine uses Arrow and numpy kernels alone.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("timelake.sources._lineproto", ["layers/timelake/sources/_lineproto.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("timelake.steps._keymatch", ["layers/timelake/steps/_keymatch.c"],
                             extra_compile_args=["-O2"], optional=True)])
