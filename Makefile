# The README's two commands are `make demo` and `make test`; both install what they need on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH_STAMP := $(VENV)/.torch-stamp
SAMPLE ?= hgx-h100-roce
# Where scripts/build-k8s.sh keeps kube-apiserver, kube-scheduler and etcd for the e2e tests.
K8S_BIN = $(shell scripts/build-k8s.sh --bin-dir)
LINT_DIRS := $(wildcard src tests bench examples)

.PHONY: demo test test-fast lint typecheck bench clean k8s-bins torch

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,nvml]'
	@touch $@

# PyTorch for the training tests (tests/train/test_ddp.py, marker `torch`): the PyPI wheel is a
# CUDA build, so this pulls ~3 GB of nvidia-* wheels (4 GB installed). Measured on the 2-core
# machine: 2 min with a cold pip cache, 1 min warm. Only `make test` needs it.
$(TORCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[torch]'
	@touch $@

torch: $(TORCH_STAMP)

demo: $(STAMP)
	$(BIN)/rdmaplane inspect --sample $(SAMPLE)
	$(BIN)/rdmaplane inspect --sample $(SAMPLE) -o matrix

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)

typecheck: $(STAMP)
	$(BIN)/mypy

# Everything but the end-to-end tier and PyTorch training: the quick loop while developing.
test-fast: lint typecheck
	$(BIN)/pytest -q -m "not e2e and not torch"

# Builds the e2e control plane on first use (tens of minutes on 2 cores), then reuses it.
k8s-bins:
	scripts/build-k8s.sh

test: lint typecheck k8s-bins torch
	RDMAPLANE_K8S_BIN="$(K8S_BIN)" $(BIN)/pytest -q

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
