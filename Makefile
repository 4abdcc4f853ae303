# The two commands of the README:
#   make demo   set up (once) and run the local demo cluster
#   make test   set up (once) and run the whole test suite (lint, types, import contracts, tests)
# Both create .venv when it is missing and install the project with its pinned dependency
# ranges; nothing outside the repository is needed beyond python3 (>= 3.11).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck contracts unit proto setup clean kube-apiserver dashboards image

demo: $(STAMP)
	$(BIN)/gputopo demo

test: lint typecheck contracts unit

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "gputopo needs Python >= 3.11; $(PYTHON) is $$($(PYTHON) -V)"; exit 1; }
	@test -x $(BIN)/python || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP) kube-apiserver
	$(BIN)/pytest $(PYTEST_ARGS)

# Tests marked `kube` run against a real kube-apiserver + etcd (one also beside a real
# kube-scheduler). Nothing ships them, so they are built once from Debian's kubernetes source
# package (about 6 minutes on 2 cores) and cached under ~/.cache/gputopo; later runs check the
# cache in well under a second. GPUTOPO_KUBE_APISERVER pointing at a v1.20.2 binary skips the
# build (GPUTOPO_KUBE_SCHEDULER then names the kube-scheduler).
kube-apiserver:
	@scripts/build-kube-apiserver.sh >/dev/null

# Regenerate the gputopo.v1 code after editing proto/ (tests fail while it is stale).
proto: $(STAMP)
	scripts/gen-proto.sh

# The OCI image ghcr.io/gputopo/gputopo:VERSION, built from Debian's archive without a daemon
# (scripts/build-image.sh; cached under ~/.cache/gputopo/image). The Dockerfile does the same.
image: $(STAMP)
	@scripts/build-image.sh

# Regenerate the Grafana dashboards in dashboards/ after changing a metric (tests fail while stale).
dashboards: $(STAMP)
	$(BIN)/python dashboards/generate.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Tests marked `prometheus` scrape the exporter and the aggregator with a real Prometheus
# (Debian's package, installed once when missing; needs root for apt-get, like the
# kube-apiserver build).
.PHONY: prometheus chromium test-gpu
unit: prometheus chromium
prometheus:
	@scripts/ensure-prometheus.sh

# Tests marked `browser` render the aggregator's /ui/ page in Debian's headless chromium.
chromium:
	@scripts/ensure-chromium.sh

# Tests marked `gpu` need an NVIDIA GPU and driver; they live in tests/gpu. `make test` deselects
# them explicitly (they are not collected as skips that would look like passes). `make test-gpu`
# runs only them: with $(PYTHON) as it is when it already has what they import (GPU images ship
# pynvml, cuda-bindings, pytest and often no package index), else in .venv with the cuda extra.
GPU_TESTS := tests/gpu
GPU_NEEDS := import pynvml, pytest, pytest_timeout, hypothesis, yaml, kubernetes
override PYTEST_ARGS += -m "not gpu"
test-gpu:
	@if $(PYTHON) -c '$(GPU_NEEDS)' 2>/dev/null; then \
	  echo "test-gpu: $$($(PYTHON) -c 'import sys; print(sys.executable)') with its own packages"; \
	  PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m pytest -p no:cacheprovider -m gpu $(GPU_TESTS) $(GPU_PYTEST_ARGS); \
	else \
	  $(MAKE) setup && \
	  $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[cuda]' && \
	  $(BIN)/pytest -m gpu $(GPU_TESTS) $(GPU_PYTEST_ARGS); \
	fi
