# The two commands of README.md: `make demo` and `make test`.  Both set everything up themselves.
PYTHON ?= python3
VENV ?= .venv
RC ?= $(CURDIR)/.rc
export RATEBEAM_RC := $(RC)

.PHONY: venv demo test lint bench servers docs

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,cloudkitty]'
	touch $@

venv: $(VENV)/.installed

demo: venv
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

bench: venv servers
	$(VENV)/bin/python bench/bench_end_to_end.py --repeat 5
	$(VENV)/bin/python bench/bench_memory.py
	$(VENV)/bin/python bench/bench_kernel_vs_cloudkitty.py
	$(VENV)/bin/python bench/bench_storage_layout.py
	$(VENV)/bin/python bench/bench_prometheus_cycle.py
	$(VENV)/bin/python bench/bench_influxdb_write.py
