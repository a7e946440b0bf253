"""The synthesized stack, shared with the infra tests: the handlers' memory limits come from it."""

from tests.infra.conftest import synthesized  # noqa: F401
