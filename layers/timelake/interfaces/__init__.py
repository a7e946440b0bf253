"""What users and the Lambda handlers call: the Python API (`lake`), the CLI, the DuckDB `CALL`
(`sql`), the workflow's step entry points (`service`) and the deployed workflow as seen from the CLI
(`orchestrator`). The only layer besides the runner that picks adapters (`timelake.adapters`).
"""
