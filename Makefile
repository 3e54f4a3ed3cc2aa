# Two entry points for a new user: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench clean

$(BIN)/sinklab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU wheel of PyTorch first, so nothing later pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/sinklab

setup: $(BIN)/sinklab

demo: setup
	$(BIN)/sinklab measure --out runs/demo

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs
