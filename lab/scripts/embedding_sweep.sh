#!/usr/bin/env bash
# Byte models with a vocabulary's memory against the BPE-token transformer, at equal training
# FLOPs spent (small preset, both corpora): the hashed n-gram embeddings (+ngram) and the chunk
# vocabulary (+cvocab), each alone and together, on the learned rule, on fixed rules and on the
# flat byte model. Seed by seed (all methods and corpora of a seed before the next), so a sweep
# cut short has whole seeds. Resumable: rerun to continue; finished runs are skipped.
#   [SEEDS="0 1 2"] bash lab/scripts/embedding_sweep.sh DATA_ROOT [BUDGET_BYTES] [METHOD ...]
# DATA_ROOT holds code-py/ and docs-en/, each with train.*, val.* and test.* files.
set -euo pipefail
source "$(dirname "$0")/data_root.sh" "usage: lab/scripts/embedding_sweep.sh DATA_ROOT [BUDGET_BYTES] [METHOD ...]" "$@"
cd "$(dirname "$0")/../.."
BUDGET=${2:-1000000}
shift $(( $# < 2 ? $# : 2 ))
METHODS=("$@")
[ ${#METHODS[@]} -gt 0 ] || METHODS=(bpe_token rl rl+ngram rl+cvocab rl+ngram+cvocab whitespace+ngram+cvocab
                                     bpe+ngram+cvocab flat flat+ngram)
RLTOK=${RLTOK:-.venv/bin/rltok}
OUT=runs/embedding/b$BUDGET
mkdir -p "$OUT"
for seed in ${SEEDS:-0 1 2}; do
  for c in code-py docs-en; do
    $RLTOK compare train.threads=1 --data "$ROOT/$c" --preset small --budget-bytes "$BUDGET" --out "$OUT/$c" \
      --split test --seeds "$seed" --methods "${METHODS[@]}" >> "$OUT/$c.log" 2>&1
  done
done
