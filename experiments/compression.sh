#!/usr/bin/env bash
# Issue 23's study on SmolLM2-135M, sized for a shared 2-core CPU (see results/compression/NOTES.md):
# eviction policies at budgets 64/128/256 on a 1024-token SOTU stream, KV quantisation of the sinks
# cache (budget 128) on 512 tokens, pass-key retrieval for the best three policies. Run from the
# repository root; each step resumes where it stopped. Then: python experiments/compression.py
set -euo pipefail
SL=${SINKLAB:-sinklab}
OUT=results/compression
$SL stream --model smollm2-135m --corpus sotu --tokens 1024 --window 256 --chunk 128 \
    --policy window sinks h2o tova sinks+h2o sinks+tova detected-sinks --budget 64 128 256 \
    --out $OUT/policies --threads 1
$SL stream --model smollm2-135m --corpus sotu --tokens 512 --window 128 --chunk 64 --no-recompute \
    --policy sinks --budget 128 --kv-bits 16 4 3 2 --key-quant token channel --sinks-full-precision 0 1 4 \
    --out $OUT/quant --threads 1
BEST=$(${PYTHON:-python} experiments/compression.py --best 3 --budget 128)
$SL stream --model smollm2-135m --corpus sotu --task passkey --tokens 512 --policy $BEST --budget 128 \
    --passkey-keys 20 --passkey-depths 0 0.25 0.5 0.75 1 --passkey-batch 50 --passkey-chunk 32 \
    --out $OUT/passkey --threads 1
