# The two commands: `make test` and `make demo` (each creates .venv first when missing).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: env test demo ui lint clean-demo

env: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: env
	@mkdir -p $(DAGSTER_HOME)
	$(PY) -m pytest

demo: env
	@mkdir -p $(DAGSTER_HOME)
	$(PY) -m jobs.demo

ui: env
	@mkdir -p $(DAGSTER_HOME)
	$(PY) -m dagster dev -w workspace.yaml

lint: env
	$(PY) -m ruff check backfill_assets resources jobs tests benchmarks

clean-demo:
	rm -rf warehouse .dagster_home
