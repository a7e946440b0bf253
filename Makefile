# Every target creates the virtualenv it needs, so a fresh clone runs `make demo` or `make test` directly.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed

.PHONY: demo test test-deps docs lint bench bench-postgres clean install synth

NPM_LOCK := $(wildcard package-lock.json)

PG_BIN := /usr/lib/postgresql/15/bin

# The runtime alone (what `make demo` needs): no CDK, no moto, no npm. --no-compile: pip would byte-compile
# every module of every package (most never imported: pyspark, botocore's, CDK's), the longest part of an
# install; Python compiles the ones a run imports on first import instead.
$(RUNTIME): pyproject.toml setup.py layers/timelake/sources/_lineproto.c layers/timelake/steps/_keymatch.c layers/timelake/model/_runs.c layers/timelake/_int_view.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e .
	touch $(RUNTIME)

# Everything the tests and the AWS deployment need on top: the dev tools and the npm packages.
$(STAMP): $(RUNTIME) pyproject.toml package.json $(NPM_LOCK)
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	npm $(if $(NPM_LOCK),ci,install) --no-audit --no-fund --loglevel=error
	touch $(STAMP)

install: $(STAMP)

# The servers and the browser that the tests run for real, llvm-strip, which strips the Lambda
# layers' aarch64 objects (GNU strip reads only this machine's), and Java with the SQLite JDBC driver
# for Spark's Iceberg catalog (tests/lake), the PostgreSQL JDBC driver and javac for Iceberg's REST catalog
# server (tests/catalogs), from Debian's packages when missing.
test-deps:
	@missing=""; \
	test -x $(PG_BIN)/postgres || missing="$$missing postgresql-15"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	test -f /usr/share/java/sqlite-jdbc.jar || missing="$$missing libxerial-sqlite-jdbc-java"; \
	test -f /usr/share/java/postgresql.jar || missing="$$missing libpostgresql-jdbc-java"; \
	command -v javac >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	command -v influxd >/dev/null || missing="$$missing influxdb"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v llvm-strip >/dev/null || missing="$$missing llvm"; \
	if [ -n "$$missing" ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; fi

demo: $(RUNTIME)
	$(VENV)/bin/timelake demo

# The suite starts a few hundred Python processes (the CLI, handlers under memory limits, servers). The install
# compiles nothing (--no-compile above), so where the environment sets PYTHONDONTWRITEBYTECODE every one of them
# compiled pandas, pyiceberg and SQLAlchemy again: 4.5 s to import the catalog against 1.2 s. The suite lets the
# first import write the bytecode for the others.
test: $(STAMP) lint test-deps docs
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n 2 --dist loadgroup --durations=15

# ruff over every Python file of the repository and mypy over the package and the Lambda handlers (what they
# check is in pyproject.toml); `test` runs it first, so a finding fails the build before the suite starts.
lint: $(STAMP)
	$(VENV)/bin/ruff check --quiet
	$(PY) -m mypy

# The documentation site, built with --strict so a broken link or anchor fails; into .venv/site, not committed.
# tests/docs runs the examples marked runnable in its pages.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir $(VENV)/site

# The CloudFormation template and assets of the AWS deployment, in cdk.out/ (cdk-nag runs as part of it).
synth: $(STAMP)
	JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 CDK_DISABLE_CLI_TELEMETRY=1 npx --no-install cdk synth --quiet --no-notices

bench: $(STAMP)
	$(PY) bench/bench_backfill.py
	$(PY) bench/bench_coverage.py

# Migrating rows from a local PostgreSQL vs the COPY floor (ROWS=10000000 by default).
bench-postgres: $(STAMP) test-deps
	$(PY) bench/bench_postgres.py $(if $(ROWS),--rows $(ROWS),)

clean:
	rm -rf $(VENV) .timelake .pytest_cache
