# Quick start:  make demo  (set up + tune an example)   |   make test  (set up + run the tests)
PYTHON ?= python3.11
VENV   ?= .venv
EXTRAS ?= cpu,dev
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup setup-lowest browser demo transcript test test-quick test-lowest test-mutants docs docs-serve ui \
	wheel clean gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=python3"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	@# KerasHub for the test of a model loaded from a local preset, without its dependency
	@# tensorflow-text, which pulls the full tensorflow wheel over tensorflow-cpu (the same
	@# package folder); keras_hub's models and presets import without it.
	$(BIN)/pip install --quiet --no-deps "keras-hub>=0.32"
	$(BIN)/pip install --quiet kagglehub regex sentencepiece tokenizers
	@touch $(STAMP)

demo: setup
	$(BIN)/precision-tuner tune examples/digits_mlp.py --space quick \
		--run-dir runs/demo-$$(date +%Y%m%d-%H%M%S) --out runs/best_precision.json

# On a machine with an NVIDIA GPU: its own environment with TensorFlow's GPU build, then a tune,
# a bench and a guarded training of a test model, and a report to paste into an issue (about
# five minutes). Without a GPU it says so and runs on the CPU.
gpu-check:
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		$(MAKE) setup VENV=.venv-gpu EXTRAS=gpu,dev && .venv-gpu/bin/precision-tuner gpu-check; \
	else \
		$(MAKE) setup && $(BIN)/precision-tuner gpu-check; \
	fi

# The example run on docs/getting-started.md, from a real tune of the demo on this machine.
transcript: setup
	$(BIN)/python docs/demo_transcript.py

# The tiers (tests/conftest.py): unit, fast, cli, slow, system, and a few slow "canary" tests.
# `make test-quick`: lint, types, the unit tier on its own, then fast + cli + canary side by side;
# a contributor's signal in under five minutes (it fails past QUICK_BUDGET_S). `make test`: the
# quick tier, then the rest. Each phase's JUnit file and the slowest tests land in test-results/.
# Two pytest workers side by side (TEST_WORKERS=1: one after the other); a module's tests stay on
# one worker, so a module's shared fixtures (a service, a tuning run) are made once. Three took
# 33-36 min instead of 37-39, but their load made the ceiling probe skip bfloat16 and a notebook
# reply arrive out of turn: not yet the default.
TEST_WORKERS ?= 2
QUICK_BUDGET_S ?= 300
TIER_RUN = $(BIN)/python -m tests.support.tier_run --workers $(TEST_WORKERS) --quick-budget $(QUICK_BUDGET_S)

test: setup browser
	$(TIER_RUN) all

test-quick: setup
	$(TIER_RUN) quick

# Each mutation a test claims to catch (tests/support/mutants.py), made in a copy and run there.
test-mutants: setup
	$(BIN)/python -m tests.support.mutants

# Debian's headless Chromium and ChromeDriver for the MLflow UI test (no browser download).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium and chromium-driver for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium chromium-driver >/dev/null; \
	else \
		echo "note: no chromium/chromedriver and no root apt-get: the browser test will skip" \
			"(install the Debian packages chromium and chromium-driver)"; \
	fi

# The documentation site (MkDocs + Material; pages in docs/, the API and CLI references
# generated from the code): a strict build into site/, or served at http://127.0.0.1:8000.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

# A wheel to install where there is no clone: dist/precision_tuner-VERSION-py3-none-any.whl,
# then `pip install "dist/precision_tuner-VERSION-py3-none-any.whl[cpu]"` (docs/install.md).
# Built in a venv of its own that holds only pip: a wheel needs no TensorFlow.
wheel:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=python3"; exit 2; }
	$(PYTHON) -m venv .venv-build
	.venv-build/bin/pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/*.whl

# The other end of the declared range: a venv at the lower bounds pyproject.toml declares (read
# from it by .ci/lowest_requirements.py and given to pip as constraints), then the quick tier,
# one real tune of the digits example and one guarded apply there, on the lowest Python that
# pyproject.toml's requires-python admits (LOWEST_PYTHON). `make test` is the newest end.
LOWEST     ?= .venv-lowest
LOWEST_PYTHON ?= python3.10
LOWEST_BIN := $(LOWEST)/bin
LOWEST_STAMP := $(LOWEST)/.installed

setup-lowest: $(LOWEST_STAMP)

$(LOWEST_STAMP): pyproject.toml .ci/lowest_requirements.py
	@$(LOWEST_PYTHON) --version >/dev/null 2>&1 || { echo "error: $(LOWEST_PYTHON) not found: the lowest end runs on the lowest Python the project admits; install it or pass LOWEST_PYTHON=/path/to/python3.10"; exit 2; }
	rm -rf $(LOWEST)
	$(LOWEST_PYTHON) -m venv $(LOWEST)
	$(LOWEST_BIN)/pip install --quiet --upgrade pip packaging "tomli; python_version < '3.11'"
	$(LOWEST_BIN)/python .ci/lowest_requirements.py cpu > $(LOWEST)/floors.txt
	$(LOWEST_BIN)/pip install --quiet -c $(LOWEST)/floors.txt -e ".[cpu,dev]"
	$(LOWEST_BIN)/pip freeze --exclude-editable > $(LOWEST)/freeze.txt
	@touch $(LOWEST_STAMP)

# The documentation's build is left out there: the docs' tools are the newest, not floored, and
# on Python 3.10 pip pairs mkdocstrings with a pymdown-extensions it cannot run with.
# The floors' own checks first (a loaded model trained under the guard; the seam's version
# differences; the range itself; the service's lock: MLflow's authentication starts, and a Ray
# without token authentication refuses to serve beyond loopback), then the quick tier, then
# one real tune with two trials side by side (Ray 2.40's workers, Optuna 5.0's study, MLflow
# 3.9's store).
test-lowest: setup-lowest
	$(LOWEST_BIN)/python -m pytest -q tests/apply/guard/test_guarded_apply_loaded.py \
		tests/apply/test_keras_internals.py tests/project/test_dependency_ranges.py \
		tests/service/test_mlflow_auth.py tests/service/test_beyond_loopback.py
	$(LOWEST_BIN)/python -m tests.support.tier_run quick --workers $(TEST_WORKERS) --no-static \
		--results test-results/lowest --quick-budget 0 --ignore tests/project/test_docs.py
	rm -rf runs/lowest
	$(LOWEST_BIN)/precision-tuner tune examples/digits_mlp.py --space quick --workers 2 \
		--run-dir runs/lowest/tune --out runs/lowest/best_precision.json

clean:
	rm -rf $(VENV) $(LOWEST) .venv-build dist runs .pytest_cache site test-results
