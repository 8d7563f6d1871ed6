# One command runs the quality bar: `make test` (lint, types, file-size budget, tests).
PY ?= .venv/bin/python
export PYTHONPATH := $(CURDIR)

.PHONY: install test lint types budget pytest demo bench clean

# The venv is (re)built when pyproject.toml changes; `make test` and `make demo` need nothing else.
install: .venv/.installed

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

lint: install
	$(PY) -m ruff check .

types: install
	$(PY) -m mypy

budget:
	@$(PY) tools/check_budget.py

pytest: install
	$(PY) -m pytest -q

test: lint types budget pytest

demo: install
	$(PY) -m services.cli run --config configs/sim_small.yaml --out runs/demo

bench: install
	$(PY) -m bench.run_all

clean:
	rm -rf .venv runs .mypy_cache .ruff_cache .pytest_cache
