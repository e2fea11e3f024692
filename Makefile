# The two commands of the README: `make demo` and `make test`. Each bootstraps what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Path to a Prometheus binary; empty means "prometheus on the PATH, installed from Debian if missing".
PROMETHEUS ?=
export PROMETHEUS

.PHONY: test demo venv prometheus peers lint bench clean image image-tools

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev,plot,docs]'
	touch $@

venv: $(VENV)/.installed

prometheus:
	@if [ -n "$(PROMETHEUS)" ]; then \
	  test -x "$(PROMETHEUS)" || { echo "PROMETHEUS=$(PROMETHEUS) is not an executable file" >&2; exit 1; }; \
	elif ! command -v prometheus >/dev/null 2>&1; then \
	  echo "prometheus is not on the PATH: installing Debian's package (needs root; or set PROMETHEUS=/path/to/prometheus)"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus; \
	fi

# The pinned programs we test and measure against (tests/peers, Go modules), built into
# tests/peers/bin only when a go.mod/go.sum or the Go version changed. Without Go: says so, succeeds.
peers:
	@scripts/build-peers.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

.PHONY: manifests
# The adapter's ConfigMap is generated from adapter/rules/defaults.py (one source for the rules).
manifests: venv
	$(BIN)/python -m adapter.rules.defaults > manifests/adapter/configmap.yaml

# charts/metricscale's generated files, from what manifests/ is made of: the default rules
# (adapter/rules/defaults.py, as `make manifests`), the CRD (manifests/autoscaler/crd.yaml), and
# the values table of docs/helm.md (values.yaml's comments). A test fails when they are stale.
.PHONY: chart
chart: venv
	$(BIN)/python charts/generate.py

# Regenerates the Grafana dashboards in manifests/monitoring/dashboards/ (committed; a test
# fails when they differ from what monitoring/dashboards.py produces).
.PHONY: dashboards
dashboards: venv
	$(BIN)/python -m monitoring.dashboards

# `make test` in stages, quickest first, so a broken change fails in a minute or two: lint,
# types, import layers and the docs site; the unit and decision tests (no Prometheus, kubectl,
# peer program, image or control plane); only then Prometheus, the peers and the image tools.
# The last three stages run side by side (`make -j3`, each one's output printed whole when it
# ends), because most of their time is waiting, not computing: what waits on Prometheus
# scrapes, kubectl, sync periods and the real control plane, on SLOW_WORKERS pytest-xdist
# workers (each starts its own session Prometheus and control plane); the container image; the
# shipped interpreter. Each module goes whole to one worker (`--dist loadscope`), the longest
# first (tests/conftest.py). The stages' times are in docs/getting-started/development.md.
FAST_TESTS := not prometheus and not kubectl and not peers and not cluster and not image
SLOW_TESTS := (prometheus or kubectl or peers or cluster) and not image
XDIST := --dist loadscope --no-loadscope-reorder
SLOW_WORKERS ?= 4

.PHONY: test-fast test-slow test-image
test: venv lint docs
	$(MAKE) test-fast
	$(MAKE) prometheus peers image-tools $(SHIPPED_VENV)/.installed
	$(MAKE) --jobs=3 --output-sync=target test-slow test-image test-shipped

test-fast: venv
	$(BIN)/pytest -n 2 $(XDIST) -m "$(FAST_TESTS)"

test-slow: venv
	$(BIN)/pytest -n $(SLOW_WORKERS) $(XDIST) -m "$(SLOW_TESTS)"

test-image: venv
	$(BIN)/pytest -m image tests/image

# The tests marked shipped_interpreter again on the Python the image ships (Debian's python3,
# 3.11.2 in bookworm): exception groups behave differently within 3.11 (`raise` inside
# `except*` is wrapped before 3.11.4), and the adapter once died of it only in the image.
SHIPPED_PYTHON ?= /usr/bin/python3
SHIPPED_VENV := .venv-debian
$(SHIPPED_VENV)/.installed: pyproject.toml
	$(SHIPPED_PYTHON) -m venv $(SHIPPED_VENV)
	$(SHIPPED_VENV)/bin/pip install --quiet --upgrade pip
	$(SHIPPED_VENV)/bin/pip install --quiet -e '.[test,dev]'  # dev: tests/monitoring imports its SDK
	touch $@

.PHONY: test-shipped
test-shipped: $(SHIPPED_VENV)/.installed prometheus
	$(SHIPPED_VENV)/bin/pytest -n 2 $(XDIST) -m shipped_interpreter

# The documentation site (mkdocs.yml, docs/), built with --strict: a broken link, a missing page or
# a page left out of the nav fails. Into site/ (git-ignored); `make docs-serve` serves it on
# http://127.0.0.1:8000 and rebuilds on every edit.
.PHONY: docs docs-serve docs-reference
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

# The generated reference pages (every command's flags, the Autoscaler CRD's fields, the
# dashboards' panels and the alerts), committed; a test in tests/docs fails when they are stale.
docs-reference: venv
	$(BIN)/python -m scripts.docs_reference

# Every benchmark, one after the other (each prints its own table; see bench/).
bench: venv prometheus peers
	$(BIN)/python bench/adapter.py
	$(BIN)/python bench/decision.py
	$(BIN)/python bench/controller.py
	$(BIN)/python bench/replay.py

demo: venv prometheus
	$(BIN)/python -m metricscale demo

# The container image: Debian's podman/mmdebstrap/runc, a base made from Debian's packages, and the
# dependencies' wheels fetched here (pip inside a container cannot verify TLS on this machine
# kind); metricscale's own wheel is built in the image's build stage.
IMAGE ?= ghcr.io/metricscale/metricscale:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE_IMAGE ?= localhost/debian:bookworm-slim
export CONTAINERS_CONF ?= $(CURDIR)/scripts/containers.conf

# The tests marked `image` build the image too: `make test` installs these when missing.
image-tools:
	@for tool in podman mmdebstrap runc; do \
	  command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian's$$missing (needs root)"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

image: venv image-tools
	rm -rf dist/wheels
	$(BIN)/pip wheel --quiet . 'setuptools>=77' wheel -w dist/wheels
	rm -f dist/wheels/metricscale-*.whl  # the image's build stage makes its own
	scripts/base-image.sh $(BASE_IMAGE)
	podman --runtime runc build --network=host --build-arg BASE=$(BASE_IMAGE) -t $(IMAGE) -f Containerfile .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .demo
