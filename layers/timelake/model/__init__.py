"""The table model: the job spec, the table contract read from table properties, the layout
(partitions, sort order, ranges), commits and their markers, time handling, source limits, cost and
the report. Pure logic over Iceberg metadata and Arrow data; it sees the adapters only through
`timelake.ports`.
"""
