#!/usr/bin/env bash
# Peers side by side (issue 23, item 6): sinklab's `sinks` policy vs attention_sinks and kvpress's
# StreamingLLMPress at 4 sinks + 256 on SmolLM2-135M, 2048 SOTU tokens (the same ids for all).
#   bash benchmarks/peers/run.sh            # venvs, ids, perplexity runs, interleaved latency, summary
#   STAGES="latency summary" bash benchmarks/peers/run.sh
# Env: PEER_VENVS (default /work/peer-venvs), SINKLAB_PY (default .venv/bin/python), ROUNDS (latency, 5),
# JOBS (perplexity runs at once, 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${PEER_VENVS:-/work/peer-venvs}
SPY=${SINKLAB_PY:-.venv/bin/python}
OUT=benchmarks/results/peers
STAGES=${STAGES:-"setup ids ppl latency summary"}
export PYTHONPATH=$PWD/src OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error \
  HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 PYTHONWARNINGS=ignore
mkdir -p "$OUT"
has() { [[ " $STAGES " == *" $1 "* ]]; }
has setup && bash benchmarks/peers/setup_venvs.sh
has ids && "$SPY" benchmarks/peers/make_ids.py
MODEL=$("$SPY" -c "import json; print(json.load(open('$OUT/ids.json'))['model_dir'])")
# one line per run: NAME PYTHON SCRIPT ARGS...
RUNS=(
  "sinklab $SPY benchmarks/peers/sinklab_peer.py"
  "sinklab_eager $SPY benchmarks/peers/sinklab_peer.py --attn eager"
  "attention_sinks $ROOT/attention_sinks/bin/python benchmarks/peers/attention_sinks_peer.py"
  "kvpress_prefill $ROOT/kvpress/bin/python benchmarks/peers/kvpress_peer.py --variant prefill"
  "kvpress_prefill-rerotate $ROOT/kvpress/bin/python benchmarks/peers/kvpress_peer.py --variant prefill-rerotate"
  "kvpress_decoding $ROOT/kvpress/bin/python benchmarks/peers/kvpress_peer.py --variant decoding"
  "kvpress_decoding-absolute $ROOT/kvpress/bin/python benchmarks/peers/kvpress_peer.py --variant decoding-absolute"
  "kvpress_decoding-absolute-sorted $ROOT/kvpress/bin/python benchmarks/peers/kvpress_peer.py --variant decoding-absolute-sorted"
  "kvpress_decoding-rerotate $ROOT/kvpress/bin/python benchmarks/peers/kvpress_peer.py --variant decoding-rerotate"
)
if has ppl; then
  for r in "${RUNS[@]}"; do
    set -- $r; name=$1; shift
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do sleep 2; done
    echo "ppl: $name"
    nice -n 5 "$@" --model-dir "$MODEL" --out "$OUT/ppl_$name.json" > "$OUT/log_$name.txt" 2>&1 &
  done
  wait
fi
if has latency; then  # interleaved: every round runs each peer once, one after the other, in a new process
  LAT=(sinklab sinklab_eager attention_sinks kvpress_decoding kvpress_decoding-rerotate)
  for round in $(seq 1 "${ROUNDS:-5}"); do
    for r in "${RUNS[@]}"; do
      set -- $r; name=$1; shift
      [[ " ${LAT[*]} " == *" $name "* ]] || continue
      echo "latency round $round: $name (load $(cut -d' ' -f1-3 /proc/loadavg))"
      nice -n 5 "$@" --model-dir "$MODEL" --latency --out "$OUT/latency/r${round}_$name.json" > /dev/null 2>&1
    done
  done
fi
has summary && "$SPY" benchmarks/peers/summary.py
