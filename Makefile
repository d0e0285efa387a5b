# The README's two commands are `make demo` and `make test`; both install what they need on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SAMPLE ?= hgx-h100-roce

.PHONY: demo test test-fast lint typecheck bench clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,nvml]'
	@touch $@

demo: $(STAMP)
	$(BIN)/rdmaplane inspect --sample $(SAMPLE)
	$(BIN)/rdmaplane inspect --sample $(SAMPLE) -o matrix

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# Everything but the end-to-end tiers: the quick loop while developing.
test-fast: lint typecheck
	$(BIN)/pytest -q -m "not e2e"

test: lint typecheck
	$(BIN)/pytest -q

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
