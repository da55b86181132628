#!/usr/bin/env bash
# The boundary-rule comparison at CPU scale: every rule and both references at equal training
# FLOPs spent, 3 seeds each, on two prepared corpora (one process per corpus, one thread each).
# Resumable: rerun to continue; finished runs are skipped.
#   bash lab/scripts/compare_sweep.sh DATA_ROOT [BUDGET_BYTES]
# DATA_ROOT holds code-py/ and docs-en/, each with train.*, val.* and test.* files.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${1:?usage: lab/scripts/compare_sweep.sh DATA_ROOT [BUDGET_BYTES]}
BUDGET=${2:-1000000}
RLTOK=${RLTOK:-.venv/bin/rltok}
mkdir -p runs/compare
run() {  # corpus
  local c=$1 out=runs/compare/$1
  $RLTOK compare train.threads=1 --data "$ROOT/$c" --preset small --budget-bytes "$BUDGET" --out "$out" --split test \
    --seeds 0 1 2 --methods rl bpe hnet whitespace flat gumbel entropy fixed uniform bpe_token
}
run code-py > runs/compare/code-py.log 2>&1 &
run docs-en > runs/compare/docs-en.log 2>&1 &
wait
