# Two commands on a fresh machine:
#   make demo   set up .venv and run examples/digits.yaml (local Prefect, MLflow on SQLite, CPU)
#   make test   set up .venv and run the test suite (what .ci/run calls)
#   make test-fast   the quick loop: lint and the tests marked not slow
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint constraints

# The package asks for ranges (pyproject.toml); the venv gets the exact set tested here.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e '.[dev,bench]'
	# pip compiles the installed modules one at a time; compileall uses every core (a fresh
	# venv in 2.9 minutes instead of 3.5 here). torch's test helpers hold Python 3.12 syntax
	# that pip skips silently; nothing here imports them.
	$(BIN)/python -m compileall -q -j0 -x '/torch/testing/_internal/' $(VENV)/lib
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/elastune run examples/digits.yaml

# Two test processes (pytest-xdist): one alone keeps 0.9 of this 2-core machine busy, most
# of the suite waiting on servers and subprocesses; two ran it in 9.6 minutes, not 15.3.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist worksteal

# The quick loop while working: lint and the tests that start no server and train no
# model (CI runs everything).
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not slow" -q

# After changing a range in pyproject.toml: the venv's exact versions become the tested set.
constraints: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	{ sed -n '/^#/p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable \
	  | sed 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
