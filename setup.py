"""The package's compiled parts; everything else is declared in pyproject.toml.

The line-protocol reader's inner loop (``layers/timelake/sources/_lineproto.c``), merge mode's key
packing and walk over two sorted key arrays (``layers/timelake/steps/_keymatch.c``) and the scan's search
for runs of one day and series (``layers/timelake/model/_runs.c``) are C. All are optional: without a
compiler the install still succeeds, and the engine uses Arrow and numpy kernels alone.
"""

from setuptools import Extension, setup

SHARED = ["layers/timelake/_int_view.h"]  # how the modules take integer arrays

setup(ext_modules=[Extension("timelake.sources._lineproto", ["layers/timelake/sources/_lineproto.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("timelake.steps._keymatch", ["layers/timelake/steps/_keymatch.c"], depends=SHARED,
                             extra_compile_args=["-O2"], optional=True),
                   Extension("timelake.model._runs", ["layers/timelake/model/_runs.c"], depends=SHARED,
                             extra_compile_args=["-O2"], optional=True)])
