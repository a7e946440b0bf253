# Every target creates the virtualenv it needs, so a fresh clone runs `make demo` or `make test` directly.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/timelake demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --durations=15

bench: $(STAMP)
	$(PY) bench/bench_backfill.py

clean:
	rm -rf $(VENV) .timelake .pytest_cache
