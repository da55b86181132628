#!/usr/bin/env bash
# Tuning the BPE-token reference: bpe_token at BPE vocabularies {1024, 4096, 16384, the one fitted
# to the target rate (model.bpe_vocab=0: the largest the 4 MB sample supports)} x depths {1, 3 (the
# small preset's main_layers)}, and 512 and 2048 at depth 1; at equal training FLOPs spent, 3 seeds,
# small preset, test split, on two prepared corpora (one process per corpus, one thread each; seed by seed, so a sweep cut
# short has whole seeds). Resumable: rerun to continue; finished runs are skipped.
#   [SEEDS="0 1 2"] bash lab/scripts/bpe_baseline_sweep.sh DATA_ROOT [BUDGET_BYTES]
# Results: runs/bpe_baseline/b<BUDGET_BYTES>/<corpus>/ (one JSON per run, a log per corpus).
# DATA_ROOT holds code-py/ and docs-en/, each with train.*, val.* and test.* files.
set -euo pipefail
source "$(dirname "$0")/data_root.sh" "usage: lab/scripts/bpe_baseline_sweep.sh DATA_ROOT [BUDGET_BYTES]" "$@"
cd "$(dirname "$0")/../.."
BUDGET=${2:-1000000}
RLTOK=${RLTOK:-.venv/bin/rltok}
OUT=runs/bpe_baseline/b$BUDGET
METHODS=()
for vocab in 1024 4096 16384 0; do
  for depth in 1 3; do
    METHODS+=("bpe_token@model.bpe_vocab=$vocab,model.flat_layers=$depth")
  done
done
# the best 1M configurations were at depth 1 and the grid's small end: its neighbours at depth 1
METHODS+=("bpe_token@model.bpe_vocab=512,model.flat_layers=1" "bpe_token@model.bpe_vocab=2048,model.flat_layers=1")
mkdir -p "$OUT"
run() {  # corpus
  for seed in ${SEEDS:-0 1 2}; do
    $RLTOK compare train.threads=1 --data "$ROOT/$1" --preset small --budget-bytes "$BUDGET" --out "$OUT/$1" \
      --split test --seeds "$seed" --methods "${METHODS[@]}"
  done
}
run code-py >> "$OUT/code-py.log" 2>&1 &
run docs-en >> "$OUT/docs-en.log" 2>&1 &
wait
