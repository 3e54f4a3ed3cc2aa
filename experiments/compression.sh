#!/usr/bin/env bash
# Issue 23's study on SmolLM2-135M at the issue's sizes (see results/compression/NOTES.md): eviction
# policies at budgets 64/128/256 on a 4096-token SOTU stream; KV quantisation of the sinks cache
# (budget 256) on the same 4096 tokens; pass-key retrieval for the best three policies at budget 128
# on 1024-token streams. Run from the repository root; each step resumes where it stopped. STEP=policies
# (then the pass key), STEP=quant (4 and 3 bits) and STEP=quant2 (2 bits) are independent: on two cores
# run two of them at once. Then: python experiments/compression.py
set -euo pipefail
SL=${SINKLAB:-sinklab}
OUT=results/compression
STEP=${STEP:-all}
if [[ $STEP == all || $STEP == policies ]]; then
  $SL stream perplexity --model smollm2-135m --corpus sotu --tokens 4096 --window 256 --chunk 128 \
      --policy window,sinks,h2o,tova,sinks+h2o,sinks+tova,detected-sinks --budget 64,128,256 \
      --out $OUT/policies --threads 1
fi
quant() {  # the widths; one call and one folder (quant_<bits>bit/) per width, since a call's stream.json holds only its own configurations
  for BITS in "$@"; do
    $SL stream perplexity --model smollm2-135m --corpus sotu --tokens 4096 --window 256 --chunk 128 --no-recompute \
        --policy sinks --budget 256 --kv-bits 16,$BITS --key-quant token,channel --sinks-full-precision 0,1,4 \
        --out $OUT/quant_${BITS}bit --threads 1
  done
}
# 4 and 3 bits (STEP=quant), 2 bits (STEP=quant2), so that the two can run at once
if [[ $STEP == all || $STEP == quant ]]; then quant 4 3; fi
if [[ $STEP == all || $STEP == quant2 ]]; then quant 2; fi
if [[ $STEP == all || $STEP == policies || $STEP == passkey ]]; then
  BEST=$(${PYTHON:-python} experiments/compression.py --best 3 --budget 128)
  $SL stream passkey --model smollm2-135m --corpus sotu --tokens 1024 --policy $BEST --budget 128 \
      --keys 20 --depths 0,0.25,0.5,0.75,1 --batch 50 --chunk 32 \
      --out $OUT/passkey --threads 1
fi
