#!/usr/bin/env bash
# Create .venv and install rltok with its test tools.
# Without an NVIDIA GPU we install the CPU build of torch first, so pip never pulls a CUDA build;
# with one, pip resolves the normal (CUDA) build from the dependency list.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q torch
  else
    .venv/bin/python -m pip install -q "torch==${RLTOK_CPU_TORCH:-2.13.0}" \
      || .venv/bin/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
.venv/bin/python -m pip install -q -e ".[dev,plot]"
.venv/bin/python -m pip install -q --no-deps -e lab  # the studies' package, beside the library
echo "rltok installed in .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
