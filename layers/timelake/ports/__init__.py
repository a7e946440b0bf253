"""The interfaces the engine needs from its surroundings: a job store, an event bus, an alarm sink,
object IO, a clock, and the `Runtime` that bundles them with the catalog. Implementations:
`timelake.adapters` (the catalog, object IO, the system clock and the embedded store, bus and alarms)
and `timelake.aws`, picked by `timelake.adapters.compose`; this package holds none
(`tests/test_architecture.py`).
"""
