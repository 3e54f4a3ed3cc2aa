# Entry points: `make demo` and `make test` for a new user, `make check` (the unit lane, about a minute) while
# changing code.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# PyTorch comes from TORCH_INDEX: the CPU build by default (no GPU libraries to download).
# For a CUDA build pass the matching index, e.g.
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
# If the index does not answer (a machine that reaches only PyPI or a local mirror), setup says so
# and installs the torch that pip finds through its own configuration instead: a local wheel where
# one is configured, else PyPI's default build (on Linux that is the CUDA build).
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: setup torch demo test check bench clean

$(BIN)/sinklab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(MAKE) --no-print-directory torch
	@$(BIN)/python -W ignore -c "import torch; print('installed torch', torch.__version__, '(CUDA ' + torch.version.cuda + ')' if torch.version.cuda else '(CPU build)')"
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/sinklab

# torch first, so that `pip install -e .` finds its requirement satisfied and pulls no other build.
torch:
	@if $(PY) -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=10)" "$(TORCH_INDEX)" 2>/dev/null; then \
		echo "torch $(TORCH_VERSION) from $(TORCH_INDEX)"; \
		$(BIN)/pip install -q "torch==$(TORCH_VERSION)" --index-url "$(TORCH_INDEX)"; \
	else \
		echo "TORCH_INDEX $(TORCH_INDEX) does not answer; installing torch $(TORCH_VERSION) from pip's own configuration (a local wheel if one is configured, else PyPI, whose Linux build is the CUDA one)"; \
		$(BIN)/pip install -q "torch==$(TORCH_VERSION)"; \
	fi

# setup also builds sinklab's fused kernels (sinklab.nn.native) once per machine and source version (tens of
# seconds; a second or two when cached), so that no test or training pays the build; without a C++ compiler it says
# so and the eager code runs (the same numbers).
setup: $(BIN)/sinklab
	@$(BIN)/python -m sinklab.nn.native

demo: setup
	$(BIN)/sinklab measure --out runs/demo

# Every test (CI runs this), spread over the cores (pytest-xdist); the 25 slowest are printed. TEST_WORKERS=1 runs
# them in one process.
TEST_WORKERS ?= auto
# PYTHONDONTWRITEBYTECODE= (empty: unset) lets the workers reuse compiled sources and rewritten test modules
# between runs where the environment turns bytecode off (about 3.5 s of collection per worker here).
test: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=25

# The unit lane: no subprocess CLI, torchrun, sweep, nested pytest, torch.compile, network or slow test (the markers in
# pyproject.toml); about a minute on two cores (benchmarks/results/test_times.md).
check: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not integration and not compile and not network and not slow and not cuda" --durations=10

clean:
	rm -rf $(VENV) runs
