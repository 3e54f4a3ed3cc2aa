#!/usr/bin/env bash
# The issue-19 campaign: every study at 5 seeds (100-104) plus the no-BOS search, trained by one
# pinned commit of the training code while development goes on in the checkout.
#
#   bash experiments/campaign.sh [STUDY ...]      # default: the order below; finished runs are skipped
#
# What it does: `git worktree add` of HEAD at .campaign/pinned (once; delete the folder to re-pin),
# then `sinklab sweep STUDY --jobs 2 --cores 2` for each study in turn with PYTHONPATH pointing at the
# pinned source, writing into this checkout's results/<name>/ (so finished studies can be committed
# as they land). Two trainings at once, one thread each (train.threads = 1 in emergence-cpu). A stopped
# campaign (Ctrl-C, SIGTERM, end of a session) continues where it stopped when started again: every
# sweep skips finished runs and resumes stopped ones from their checkpoint.
#
# Re-pinning at a later commit is safe when the training-code fingerprints have not changed:
# `sinklab report results --check` says so (exit 0) before the new pin trains anything.
#
# Compute (2 trainings at once on 2 cores, about 150-200 s per 1000-step emergence-cpu run each):
# attention_operation 100 runs (19 rows trained, the diff row new), positional_encoding 30,
# weight_decay 40, first_token 30, no_bos ~60 run-equivalents (2000 steps, larger models), no_bos_confirm
# ~10 (5 seeds x 2000 steps), finetune_base 6 and finetune 3 (500-step fine-tunings),
# kv_bias 40 (+10 copied), learning_rate ~52 equivalents (500-4000 steps), batch_size ~19,
# ffn 30, norm_position 10, heads 20, data_amount 25, prefix_lm 15, sliding_window 20:
# about 400 run-equivalents, 8-9 hours of wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
pinned="$root/.campaign/pinned"
if [ ! -d "$pinned" ]; then
  mkdir -p "$root/.campaign"
  git worktree add --detach "$pinned" HEAD
fi
echo "campaign: training code of $(git -C "$pinned" rev-parse --short HEAD) ($pinned)"
studies=("$@")
if [ ${#studies[@]} -eq 0 ]; then
  studies=(attention_operation no_bos no_bos_confirm finetune_base finetune positional_encoding weight_decay
           first_token kv_bias learning_rate batch_size ffn norm_position heads data_amount prefix_lm
           sliding_window)
fi
python="${PYTHON:-$root/.venv/bin/python}"
for name in "${studies[@]}"; do
  echo "== $(date -u +%FT%TZ) $name"
  PYTHONPATH="$pinned/src" "$python" -c "from sinklab.cli.main import app; app()" \
    sweep "experiments/$name.toml" --jobs 2 --cores 2 --out "results/$name" --no-progress
done
