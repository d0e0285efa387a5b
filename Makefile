# The README's two commands are `make demo` and `make test`; both install what they need on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH_STAMP := $(VENV)/.torch-stamp
SAMPLE ?= hgx-h100-roce
# Where scripts/build-k8s.sh keeps kube-apiserver, kube-scheduler and etcd for the e2e tests,
# the kubelet admission harness (device manager + Topology Manager) for tests/kubelet, the DRA
# allocator harness (upstream's structured allocator) for tests/dra_allocator, and the node
# (kubelet, containerd, CNI plugins) for tests/node.
K8S_BIN = $(shell scripts/build-k8s.sh --bin-dir)
KUBELET_HARNESS = $(shell scripts/build-k8s.sh kubelet-harness --path)
DRA_ALLOCATOR = $(shell scripts/build-k8s.sh dra-allocator --path)
NODE_BIN = $(shell scripts/build-k8s.sh node --bin-dir)
LINT_DIRS := $(wildcard src tests bench examples image)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The image of every component (Dockerfile), built without a registry: an OCI archive.
IMAGE_ARCHIVE := dist/rdmaplane-$(VERSION).oci.tar
IMAGE_INPUTS := Dockerfile constraints.txt pyproject.toml README.md image/packages.txt \
  image/debian.lock $(wildcard image/*.py) $(shell find src -type f -not -path '*/__pycache__/*')

.PHONY: demo test test-fast lint typecheck bench clean k8s-bins graphviz torch node-deps image image-lock

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,nvml]'
	@touch $@

# PyTorch and numpy for the training tests (tests/train/, marker `torch`): the PyPI wheel is a
# CUDA build, so this pulls ~3 GB of nvidia-* wheels (5.3 GB installed). Measured on the 2-core
# machine: 2 min with a cold pip cache, 1 min warm. `make test` and `make bench` need it.
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
	$(BIN)/lint-imports --no-cache  # the layers: pyproject's [tool.importlinter]
	@# the layout's rules: folders in the contracts, the tree in docs/architecture.md, one name
	@# per public class, our names and default paths defined once
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_layers.py tests/unit/test_names.py tests/unit/test_paths.py

typecheck: $(STAMP)
	$(BIN)/mypy

# Graphviz's `dot` judges `rdmaplane inspect -o dot` in the tests (Debian's package, once).
graphviz:
	@command -v dot >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz >/dev/null; } || \
	  { echo "Graphviz is needed for the tests: apt-get install graphviz" >&2; exit 1; }

# The real node of tests/node runs containers with runc; busybox-static is its images' userland
# and the verbs libraries go into the doctor's image (Debian's packages, once: ~15 s, 15 MB; the
# rest of the node is built by scripts/build-k8s.sh node).
NODE_PACKAGES := runc busybox-static libibverbs1 ibverbs-providers
node-deps:
	@dpkg -s $(NODE_PACKAGES) >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(NODE_PACKAGES) >/dev/null; } || \
	  { echo "The node tests need Debian's $(NODE_PACKAGES): apt-get install them" >&2; exit 1; }

# The image as an OCI archive, from Debian's packages (image/debian.lock, hashes checked; cached
# in ~/.cache/rdmaplane/image) and PyPI's wheels (constraints.txt), with no registry and no
# Docker: load it with `ctr images import`, `kind load image-archive`, `docker load` or `podman
# load` (docs/image.md). Needs root, or user namespaces for unshare, to run the image's own
# python and ldconfig in it. Measured on the 2-core machine: 35-50 s cold (empty caches),
# 18-44 s warm (a source changed), 0.1 s when nothing did.
image: $(IMAGE_ARCHIVE)

# The virtualenv's python: pip is there (a system python3 may lack it); order-only, since the
# archive follows from its inputs alone.
$(IMAGE_ARCHIVE): $(IMAGE_INPUTS) | $(STAMP)
	$(BIN)/python -m image oci $@

# Re-resolve image/packages.txt against Debian's current bookworm suites (signatures checked).
image-lock: | $(STAMP)
	$(BIN)/python -m image lock

# Everything but the tiers that need Go-built upstream binaries or PyTorch: the quick loop.
test-fast: lint typecheck graphviz
	$(BIN)/pytest -q  # the unit and integration tiers: pyproject's addopts

# Builds the e2e control plane, the kubelet harness, the DRA allocator harness and the node on
# first use (tens of minutes on 2 cores), then reuses them; Go's caches of those builds (~7 GB)
# go once all are built.
k8s-bins:
	scripts/build-k8s.sh
	scripts/build-k8s.sh kubelet-harness
	scripts/build-k8s.sh dra-allocator
	scripts/build-k8s.sh node
	scripts/build-k8s.sh trim

test: lint typecheck graphviz k8s-bins torch node-deps image
	RDMAPLANE_K8S_BIN="$(K8S_BIN)" RDMAPLANE_KUBELET_HARNESS="$(KUBELET_HARNESS)" \
	  RDMAPLANE_DRA_ALLOCATOR="$(DRA_ALLOCATOR)" RDMAPLANE_NODE_BIN="$(NODE_BIN)" RDMAPLANE_IMAGE="$(IMAGE_ARCHIVE)" $(BIN)/pytest -q -m ""

# Benchmarks run by hand, not by `make bench`: the real kube-scheduler's fabric runs take about 10
# minutes or more each on the 2-core machine (their docstrings say how; docs/fabric.md quotes them).
BENCH_BY_HAND := bench/fabric_jobs_real.py bench/fabric_rails_real.py

bench: $(TORCH_STAMP)  # bench/emergency_save.py saves with PyTorch
	scripts/build-k8s.sh kubelet-harness >/dev/null  # the judge of placement.py, fabric_rails.py
	scripts/build-k8s.sh >/dev/null  # the control plane and KWOK of cluster, apiserver_load, fault
	@for b in $(filter-out $(BENCH_BY_HAND),$(sort $(wildcard bench/*.py))); do \
	  echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
