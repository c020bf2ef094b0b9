# Nstance developer entry points. Every target creates and reuses .venv by itself,
# so a fresh machine with python3 (>= 3.11) needs nothing else.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: run run-k8s test check lint fmt typecheck imports proto proto-check manifests manifests-check bench sim clean help

help:
	@echo "make run    - run a local shard from examples/local (nstance-server, 3 local instances, live view)"
	@echo "make run-k8s - two local shards + nstance-operator + a Kubernetes API (real if built) for kubectl"
	@echo "make test   - run the whole test suite"
	@echo "make check  - ruff, ruff format --check, mypy --strict, import-linter, generated-code drift"
	@echo "make proto  - regenerate nstance/rpc/ from protos/"
	@echo "make manifests - regenerate CRDs, RBAC, webhook manifests (config/) and the chart's copies"
	@echo "make bench  - run every benchmark in bench/; writes bench/results.json and docs/performance.md"
	@echo "make sim    - deterministic simulation: SEEDS=N seeds (default 100) from START=N (default 0), JOBS=N processes (default 2)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" exec bash scripts/run_local.sh

run-k8s: $(STAMP)
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/run_k8s.py

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

imports: $(STAMP)
	$(VENV)/bin/lint-imports

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

proto-check: $(STAMP)
	$(PY) scripts/gen_proto.py --check

manifests: $(STAMP)
	$(PY) scripts/gen_manifests.py

manifests-check: $(STAMP)
	$(PY) scripts/gen_manifests.py --check

check: lint typecheck imports proto-check manifests-check
	$(PY) scripts/gen_config_docs.py --check

bench: $(STAMP)
	@$(PY) bench/run_all.py

SEEDS ?= 100
START ?= 0
JOBS  ?= 2

sim: $(STAMP)
	$(PY) -m nstance.simulation --start $(START) --seeds $(SEEDS) --jobs $(JOBS)

clean:
	rm -rf $(VENV) .local .pytest_cache .mypy_cache .ruff_cache
