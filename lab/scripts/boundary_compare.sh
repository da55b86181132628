#!/usr/bin/env bash
# Does the learned boundary rule pay? rl (the small preset's lexicon recipe) against the
# published recipe and the fixed rules at equal training FLOPs spent, 3 seeds, on two prepared
# corpora (one process per corpus, one thread each). Resumable: finished runs are skipped.
#   bash lab/scripts/boundary_compare.sh DATA_ROOT [BUDGET_BYTES] [METHOD ...]
# Results: runs/boundaries/b<BUDGET_BYTES>/<corpus>/ (SEEDS="0 1 2" by default).
# DATA_ROOT holds code-py/ and docs-en/, each with train.*, val.* and test.* files.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${1:?usage: lab/scripts/boundary_compare.sh DATA_ROOT [BUDGET_BYTES] [METHOD ...]}
BUDGET=${2:-1000000}
shift $(( $# > 1 ? 2 : 1 ))
METHODS=("$@")
[ ${#METHODS[@]} -gt 0 ] || METHODS=(rl uniform fixed whitespace rl_reference hnet entropy)
RLTOK=${RLTOK:-.venv/bin/rltok}
SEEDS=${SEEDS:-0 1 2}
OUT=runs/boundaries/b$BUDGET
mkdir -p "$OUT"
run() {  # corpus
  $RLTOK compare train.threads=1 --data "$ROOT/$1" --preset small --budget-bytes "$BUDGET" \
    --out "$OUT/$1" --split test --seeds $SEEDS --methods "${METHODS[@]}"
}
run code-py > "$OUT/code-py.log" 2>&1 &
run docs-en > "$OUT/docs-en.log" 2>&1 &
wait
