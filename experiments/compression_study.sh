#!/usr/bin/env bash
# Issue 35's study (part 7): KV-cache policies judged over many streams (perplexity, KL and top-1 agreement with the
# full cache, 95% t-intervals over streams, paired comparisons) and on long-context retrieval, on SmolLM2-135M.
# Headline configurations first; each step writes its own folder under results/compression/study/ and resumes
# where it stopped (a stopped step loses at most the configuration it was computing).
#
#   bash experiments/compression_study.sh            # every step in order
#   STEP=policies bash experiments/compression_study.sh
#
# Steps (one torch thread each; on two cores run two steps at once):
#   policies  8 streams x 512 tokens (4 State of the Union addresses, 4 Austen novels: one document per stream),
#             window / sinks / h2o / tova at budgets 64 / 128 / 256, 16-bit storage, and the full cache. A budget
#             of 512 equals the full cache on 512-token streams, so it is not run here.
#   storage   the same streams, sinks and window at budget 128, stored in 16 / 4 / 2 bits, and 2 bits with the
#             4 sink tokens lossless (--sinks-full-precision 4).
#   needle    needle in a haystack of real essays (pg-essays) at 1024 / 2048 tokens x depths 0 / 0.5 / 1, 3 items
#             per cell, under the full cache (the ceiling) and sinks / snapkv / pyramidkv / knorm / window at
#             budgets 128 / 256, chunked prefill at the window.
#   ruler     the RULER-style suite (6 sub-tasks) in the same haystacks, 1024 / 2048 tokens x depths 0 / 0.5 / 1,
#             3 items per cell, full cache and sinks / snapkv / window at budget 128 (knorm, 0 of 18 on the needle, left out).
#   passkey   the pass key (a 5-digit key in State of the Union addresses, the haystack of `sinklab stream passkey`;
#             the task suite's `passkey` items) at 1024 / 2048 tokens x depths 0 / 0.5 / 1, 5 items per cell, full
#             cache and sinks / snapkv / window at budgets 128 / 256. (In the essays haystack, the suite's default,
#             the full cache answered 0 of 30: study/passkey_essays/, made by this step without --corpus sotu.)
#   needle_storage  the needle task with sinks at budget 128 stored in 16 / 4 / 2 bits, and 2 bits with the 4 sink
#             tokens lossless (the tasks under quantised storage).
#   needle_long     the needle task at 4096 / 8000 tokens (prompt and answer within SmolLM2's context of 8192), budgets 256 / 512,
#             sinks / snapkv / window.
#   gemma     Gemma-3-270M (zoo gemma3-270m: accept its licence once with `sinklab fetch gemma3-270m
#             --accept-license`): 8 streams x 1024 tokens (longer than its sliding-window layers' 512), window /
#             sinks at budgets 128 / 256 (parallel evaluation; token-by-token tova took about 2 h per configuration here).
#   long      perplexity on 8 streams x 2048 tokens, window / sinks at budgets 256 / 512 (budget 512 on streams
#             longer than it).
set -euo pipefail
SL=${SINKLAB:-sinklab}
OUT=results/compression/study
STEP=${STEP:-all}
STREAMS="--model smollm2-135m --corpus sotu,austen --streams 8 --tokens 512 --no-recompute --threads 1"
if [[ $STEP == all || $STEP == policies ]]; then
  $SL stream perplexity $STREAMS --policy window,sinks,h2o,tova --budget 64,128,256 --out $OUT/policies
fi
if [[ $STEP == all || $STEP == storage ]]; then
  $SL stream perplexity $STREAMS --policy sinks,window --budget 128 --kv-bits 16,4,2 --sinks-full-precision 0,4 \
      --out $OUT/storage
fi
if [[ $STEP == all || $STEP == needle ]]; then
  $SL stream needle --model smollm2-135m --lengths 1024,2048 --depths 0,0.5,1 --items 3 \
      --policy sinks,snapkv,pyramidkv,knorm,window --budget 128,256 --threads 1 --out $OUT/needle
fi
if [[ $STEP == all || $STEP == ruler ]]; then
  $SL stream ruler --model smollm2-135m --lengths 1024,2048 --depths 0,0.5,1 --items 3 \
      --policy sinks,snapkv,window --budget 128 --threads 1 --out $OUT/ruler
fi
if [[ $STEP == all || $STEP == passkey ]]; then
  $SL stream ruler --tasks passkey --corpus sotu --model smollm2-135m --lengths 1024,2048 --depths 0,0.5,1 --items 5 \
      --policy sinks,snapkv,window --budget 128,256 --threads 1 --out $OUT/passkey
fi
if [[ $STEP == all || $STEP == needle_storage ]]; then
  $SL stream needle --model smollm2-135m --lengths 1024,2048 --depths 0,0.5,1 --items 3 \
      --policy sinks --budget 128 --kv-bits 16,4,2 --sinks-full-precision 0,4 --threads 1 --out $OUT/needle_storage
fi
if [[ $STEP == all || $STEP == needle_long ]]; then
  $SL stream needle --model smollm2-135m --lengths 4096,8000 --depths 0,0.5,1 --items 3 \
      --policy sinks,snapkv,window --budget 256,512 --threads 1 --out $OUT/needle_long
fi
if [[ $STEP == all || $STEP == long ]]; then
  $SL stream perplexity --model smollm2-135m --corpus sotu,austen --streams 8 --tokens 2048 --no-recompute \
      --threads 1 --policy window,sinks --budget 256,512 --out $OUT/long
fi
if [[ $STEP == all || $STEP == gemma ]]; then
  $SL stream perplexity --model gemma3-270m --corpus sotu,austen --streams 8 --tokens 1024 --no-recompute \
      --threads 1 --policy window,sinks --budget 128,256 --out $OUT/gemma
fi
