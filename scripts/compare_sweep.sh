#!/usr/bin/env bash
# The issue-3 comparison at CPU scale: every rule at equal training FLOPs on both prepared
# corpora, seed 0 for all methods and seed 1 for the main ones. Resumable: rerun to continue.
#   bash scripts/compare_sweep.sh [BUDGET_BYTES] [DATA_ROOT]
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-1000000}
ROOT=${2:-../shared/data}
RLTOK=${RLTOK:-.venv/bin/rltok}
run() {  # corpus
  local c=$1 out=runs/compare/$1
  $RLTOK compare train.threads=1 --data "$ROOT/$c" --preset small --budget-bytes "$BUDGET" --out "$out" --split test \
    --seeds 0 --methods rl bpe hnet whitespace flat gumbel entropy fixed uniform bpe_token
  $RLTOK compare train.threads=1 --data "$ROOT/$c" --preset small --budget-bytes "$BUDGET" --out "$out" --split test \
    --seeds 1 --methods rl bpe hnet whitespace flat
}
run code-py > runs/compare/code-py.log 2>&1 &
run docs-en > runs/compare/docs-en.log 2>&1 &
wait
