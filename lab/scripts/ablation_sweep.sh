#!/usr/bin/env bash
# Variance reduction: the reference's ablations and the new variance reducers (group baselines,
# the critic with GAE) at equal training FLOPs on both prepared corpora (small preset, test split).
# The plain `rl` runs of the main comparison are reused as the reference row. Resumable: rerun to
# continue.
#   bash lab/scripts/ablation_sweep.sh DATA_ROOT [BUDGET_BYTES]
# DATA_ROOT holds code-py/ and docs-en/, each with train.*, val.* and test.* files.
set -euo pipefail
source "$(dirname "$0")/data_root.sh" "usage: lab/scripts/ablation_sweep.sh DATA_ROOT [BUDGET_BYTES]  (DATA_ROOT holds code-py/ and docs-en/)" "$@"
BUDGET=${2:-1000000}
cd "$(dirname "$0")/../.."
RLTOK=${RLTOK:-.venv/bin/rltok}
PYTHON=${PYTHON:-.venv/bin/python}
run() {  # corpus
  local c=$1 out=runs/ablation/$1
  mkdir -p "$out"
  for s in 0 1; do  # reuse the main comparison's reference runs
    [ -e "$out/rl_s$s.json" ] || PYTHONPATH=lab "$PYTHON" -m rltok_lab.records extract "compare/$c/rl_s$s.json" "$out" || true
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
