"""What runs after publish: rollups refreshed over the published ranges, rules evaluated in
historical mode, the coverage map and its completion signal, the provenance record, the heatmap.
"""
