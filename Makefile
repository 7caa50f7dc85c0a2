# The two commands of the README: `make lab` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: lab test lint typecheck check clean notebook-filter

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch: a build already there (a CUDA one) is kept; none, a CPU build (.ci/install_torch.py)
	$(BIN)/python .ci/install_torch.py
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

# Notebooks run and saved keep `git status` clean: outputs never reach git (.gitattributes).
notebook-filter:
	-@git rev-parse --git-dir >/dev/null 2>&1 && git config filter.krex-notebook.clean "python3 notebooks/strip_outputs.py"

# make lab ARGS="--port 9999 --no-browser": krex lab's options and JupyterLab's, passed on
ARGS ?=
lab: $(STAMP) notebook-filter
	$(BIN)/krex lab $(ARGS)

TEST_WORKERS ?= 1

test: $(STAMP) notebook-filter
	$(BIN)/ruff check krex_lab tests benchmarks
	$(BIN)/ruff format --check krex_lab tests benchmarks
	$(BIN)/mypy
	# TEST_WORKERS=2: two passes (tests/support/workers.py): two xdist workers, then the few files
	# that take the node's cores or time against a bound, alone; both always run. Off by default:
	# an ordinary user's runs on two workers still fail timing-bound tests now and then.
	if [ "$(TEST_WORKERS)" -gt 1 ] 2>/dev/null; then \
	  status=0; \
	  $(BIN)/python -m pytest -q -ra --durations=25 -n $(TEST_WORKERS) -m "not serial" tests || status=$$?; \
	  $(BIN)/python -m pytest -q -ra --durations=10 -m serial tests || status=$$?; \
	  exit $$status; \
	else \
	  $(BIN)/python -m pytest -q -ra --durations=25 tests; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check krex_lab tests benchmarks
	$(BIN)/ruff format --check krex_lab tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
