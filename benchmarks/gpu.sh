#!/usr/bin/env bash
# The device script: everything sinklab checks and measures on one GPU (the first four steps about 9 minutes on an H200, analyze + stream at most 5 more; --only STEP ... picks)
# (see benchmarks/gpu.py for the steps). One command; writes gpu.json, summary.txt, logs/ and
# cuda_tests.xml under $OUT (default benchmarks/results/gpu, the smoke run benchmarks/results/gpu-smoke);
# exits 1 when any step failed.
#
#   bash benchmarks/gpu.sh                       # on the GPU machine
#   SINKLAB_GPU_SMOKE=1 bash benchmarks/gpu.sh   # every step on the CPU at tiny sizes (CUDA tests skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ "${SINKLAB_GPU_SMOKE:-}" = 1 ]; then OUT="${OUT:-benchmarks/results/gpu-smoke}"; else OUT="${OUT:-benchmarks/results/gpu}"; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" benchmarks/gpu.py --out "$OUT" "$@"
