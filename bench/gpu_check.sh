#!/usr/bin/env bash
# GPU check (bench/gpu_check.py): nl-147m preset, a few hundred bf16 steps, bytes/s and MFU; --tiny runs it on a CPU.
exec "${PYTHON:-python}" "$(dirname "$0")/gpu_check.py" "$@"
