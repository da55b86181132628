#!/usr/bin/env bash
# Supertokens: the learned vocabularies of frontier checkpoints against BPE at the same rate, on
# the test split of each corpus (200k bytes), into lab/results/vocab/. Run after frontier_sweep.sh;
# then `python lab/scripts/frontier_report.py` tabulates them in lab/reports/SUPERTOKENS.md. Resumable.
#   bash lab/scripts/vocab_report.sh DATA_ROOT
# DATA_ROOT holds code-py/ and docs-en/, each with train.*, val.* and test.* files.
set -euo pipefail
source "$(dirname "$0")/data_root.sh" "usage: lab/scripts/vocab_report.sh DATA_ROOT  (DATA_ROOT holds code-py/ and docs-en/)" "$@"
cd "$(dirname "$0")/../.."
LAB=${LAB:-.venv/bin/python -m rltok_lab}  # the lab's command line
OUT=lab/results/vocab
mkdir -p "$OUT"
for c in code-py docs-en; do
  for run in "rl__model.target_rate-0.1_s0" "rl__objective.rate_control-none_objective.compute_price-0.01_s0" \
             "rl__objective.rate_control-none_objective.compute_price-0.003_s0" "rl__model.stages-2_s0"; do
    ckpt=runs/frontier/$c/runs/$run
    name=${c}__${run}
    [ -d "$ckpt" ] || { echo "skip $name (no checkpoint)"; continue; }
    [ -e "$OUT/$name.json" ] && { echo "$name: done already"; continue; }
    $LAB vocab "$ckpt" --data "$ROOT/$c" --split test --threads 1 --json "$OUT/$name.json" --markdown "$OUT/$name.md" > /dev/null
    echo "$name: written"
  done
done
