# The two commands of the README: `make demo` and `make test`. Each bootstraps what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Path to a Prometheus binary; empty means "prometheus on the PATH, installed from Debian if missing".
PROMETHEUS ?=
export PROMETHEUS

.PHONY: test demo venv prometheus lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $@

venv: $(VENV)/.installed

prometheus:
	@if [ -n "$(PROMETHEUS)" ]; then \
	  test -x "$(PROMETHEUS)" || { echo "PROMETHEUS=$(PROMETHEUS) is not an executable file" >&2; exit 1; }; \
	elif ! command -v prometheus >/dev/null 2>&1; then \
	  echo "prometheus is not on the PATH: installing Debian's package (needs root; or set PROMETHEUS=/path/to/prometheus)"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus; \
	fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Regenerates the Grafana dashboards in manifests/monitoring/dashboards/ (committed; a test
# fails when they differ from what monitoring/dashboards.py produces).
.PHONY: dashboards
dashboards: venv
	$(BIN)/python -m monitoring.dashboards

test: venv prometheus lint
	$(BIN)/pytest

demo: venv prometheus
	$(BIN)/python -m metricscale demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .demo
