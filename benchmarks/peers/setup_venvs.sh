#!/usr/bin/env bash
# Create one virtual environment per peer under $PEER_VENVS (default /work/peer-venvs, outside the repo),
# each with the transformers version that peer supports and the CPU build of torch (the local
# wheel pip finds through its find-links; a constraints file keeps pip from replacing it).
#   attention_sinks 0.4.0 (tomaarsen): pins transformers==4.34.0, tokenizers<0.15
#   kvpress 0.5.5 (NVIDIA): transformers>=4.56,<5.3 (the newest allowed: 5.2.x)
# Usage: bash benchmarks/peers/setup_venvs.sh   (idempotent: an existing venv is reused)
set -euo pipefail
ROOT=${PEER_VENVS:-/work/peer-venvs}
PY=${PEER_PYTHON:-python3.11}
TORCH=${PEER_TORCH:-2.13.0}
mkdir -p "$ROOT"
echo "torch==$TORCH" > "$ROOT/constraints.txt"
make_venv() {  # name, packages...
  local name=$1; shift
  local v="$ROOT/$name"
  [ -x "$v/bin/python" ] || "$PY" -m venv "$v"
  "$v/bin/pip" install -q "torch==$TORCH" -c "$ROOT/constraints.txt"
  "$v/bin/pip" install -q -c "$ROOT/constraints.txt" "$@"
  "$v/bin/python" -c "import torch, transformers; print('$name', 'torch', torch.__version__, 'transformers', transformers.__version__)"
}
make_venv attention_sinks "attention_sinks==0.4.0" "transformers==4.34.0" "tokenizers>=0.14,<0.15" "numpy<2" "einops"
make_venv kvpress "kvpress==0.5.5" "transformers>=4.56,<5.3"
