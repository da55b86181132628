#!/usr/bin/env bash
# Issue 4: the reference's ablations and the new variance reducers at equal training FLOPs on both
# prepared corpora (small preset, test split). The plain `rl` runs of the main comparison are reused
# as the reference row. Resumable: rerun to continue.
#   bash scripts/ablation_sweep.sh [BUDGET_BYTES] [DATA_ROOT]
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-1000000}
ROOT=${2:-../shared/data}
RLTOK=${RLTOK:-.venv/bin/rltok}
run() {  # corpus
  local c=$1 out=runs/ablation/$1
  mkdir -p "$out"
  for s in 0 1; do  # reuse the main comparison's reference runs
    [ -e "$out/rl_s$s.json" ] || { [ -e "docs/results/compare/$c/rl_s$s.json" ] && cp "docs/results/compare/$c/rl_s$s.json" "$out/"; } || true
  done
  $RLTOK compare train.threads=1 --data "$ROOT/$c" --preset small --budget-bytes "$BUDGET" --out "$out" --split test \
    --seeds 0 --methods rl rl_group4 rl_value rl_gamma1 rl_no_batch rl_final_reward rl_w8 rl_no_rate rl_group4_value
  $RLTOK compare train.threads=1 --data "$ROOT/$c" --preset small --budget-bytes "$BUDGET" --out "$out" --split test \
    --seeds 1 --methods rl rl_group4 rl_value
}
mkdir -p runs/ablation
run code-py > runs/ablation/code-py.log 2>&1 &
run docs-en > runs/ablation/docs-en.log 2>&1 &
wait
