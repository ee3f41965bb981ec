# Quick start:  make demo  (set up + tune an example)   |   make test  (set up + run the tests)
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast ui clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=python3"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[cpu,dev]"
	@touch $(STAMP)

demo: setup
	$(BIN)/precision-tuner tune examples/digits_mlp.py --space quick \
		--run-dir runs/demo-$$(date +%Y%m%d-%H%M%S) --out runs/best_precision.json --force

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
