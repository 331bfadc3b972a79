# The two commands of README.md: `make demo` and `make test`.  Both set everything up themselves.
# Every install takes the versions of constraints.txt (`make lock` refreshes it, docs/deployment.md).
PYTHON ?= python3
VENV ?= .venv
RC ?= $(CURDIR)/.rc
CONTAINER ?= podman
# uv compiles constraints.txt (`make lock`); UPGRADE=1 takes the newest releases pyproject allows.
UV_VERSION ?= 0.13.9
PIP_INSTALL = $(VENV)/bin/pip install -q -c constraints.txt
export RATEBEAM_RC := $(RC)

.PHONY: venv demo test lint bench servers lock image docs

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

# The demo needs no extra: the runtime dependencies only (`make test` adds the test tools).
$(VENV)/.runtime: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[test]'
	touch $@ $(VENV)/.runtime

venv: $(VENV)/.installed

demo: $(VENV)/.runtime
	$(VENV)/bin/ratebeam demo

servers: venv
	bash tests/servers/install.sh

# ruff (style, docstrings, public type hints), then mypy on transforms/ and connectors/.
lint: venv
	$(VENV)/bin/ruff check .
	bash tools/typecheck.sh $(VENV)/bin/mypy

# docs/cli.md's command reference, generated from the parser (a test fails when it is stale).
docs: venv
	$(VENV)/bin/python -m ratebeam.pipelines.commands.reference docs/cli.md

test: venv servers lint
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=30

# constraints.txt from pyproject.toml's ranges, every extra and `test`, for CPython 3.11 on Linux;
# the versions already pinned are kept where they still fit (UPGRADE=1: the newest that fit).
lock: | $(VENV)/bin/python
	$(VENV)/bin/pip install -q 'uv==$(UV_VERSION)'
	$(VENV)/bin/uv pip compile --quiet pyproject.toml --all-extras --python-version 3.11 --python-platform linux \
		$(if $(UPGRADE),--upgrade) --custom-compile-command 'make lock' -o constraints.txt

# The container image (Dockerfile; build arguments in docs/deployment.md).
image:
	$(CONTAINER) build -t ratebeam:latest .

bench: venv servers
	$(VENV)/bin/python bench/bench_end_to_end.py --repeat 5
	$(VENV)/bin/python bench/bench_memory.py
	$(VENV)/bin/python bench/bench_kernel_vs_cloudkitty.py
	$(VENV)/bin/python bench/bench_storage_layout.py
	$(VENV)/bin/python bench/bench_prometheus_cycle.py
	$(VENV)/bin/python bench/bench_influxdb_write.py
