"""The engine version, recorded in every job's provenance."""

__version__ = "0.1.0"
