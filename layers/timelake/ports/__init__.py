"""The interfaces the engine needs from its surroundings: a job store, an event bus, an alarm sink,
object IO, and the `Runtime` that bundles them. Implementations: `timelake.adapters` (embedded)
and `timelake.aws`.
"""
