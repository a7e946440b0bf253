# Every target creates the virtualenv it needs, so a fresh clone runs `make demo` or `make test` directly.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-postgres clean install synth

NPM_LOCK := $(wildcard package-lock.json)

PG_BIN := /usr/lib/postgresql/15/bin

$(STAMP): pyproject.toml package.json $(NPM_LOCK)
	test -x $(PG_BIN)/postgres || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql-15)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	npm $(if $(NPM_LOCK),ci,install) --no-audit --no-fund --loglevel=error
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	command -v influxd >/dev/null || (apt-get update && apt-get install -y influxdb)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/timelake demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --durations=15

# The CloudFormation template and assets of the AWS deployment, in cdk.out/ (cdk-nag runs as part of it).
synth: $(STAMP)
	JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 CDK_DISABLE_CLI_TELEMETRY=1 npx --no-install cdk synth --quiet --no-notices

bench: $(STAMP)
	$(PY) bench/bench_backfill.py
	$(PY) bench/bench_coverage.py

# Migrating rows from a local PostgreSQL vs the COPY floor (ROWS=10000000 by default).
bench-postgres: $(STAMP)
	$(PY) bench/bench_postgres.py $(if $(ROWS),--rows $(ROWS),)

clean:
	rm -rf $(VENV) .timelake .pytest_cache
