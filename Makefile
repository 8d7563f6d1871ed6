# One command runs the quality bar: `make test` (lint, types, file-size budget, tests).
PY ?= .venv/bin/python
export PYTHONPATH := $(CURDIR)

.PHONY: install test lint types budget pytest demo bench clean

install:
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'

lint:
	$(PY) -m ruff check .

types:
	$(PY) -m mypy

budget:
	@$(PY) tools/check_budget.py

pytest:
	$(PY) -m pytest -q

test: lint types budget pytest

demo:
	$(PY) -m services.cli run --config configs/sim_small.yaml --out runs/demo

bench:
	$(PY) -m bench.run_all
