VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint bench-http

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# A local cluster (SeaweedFS + Tansu + coordinator + 2 workers) running the bank demo.
demo: install
	$(VENV)/bin/styx up --demo

# The whole test suite (starts its own services).
test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check styx_py coordinator worker client benchmarks tests
	$(VENV)/bin/mypy

# What the HTTP gateway adds over the SDK: bank transfers at 200/s, p50/p99 (README "HTTP API").
bench-http: install
	$(PY) -m benchmarks.http_overhead --rate 200 --seconds 10
