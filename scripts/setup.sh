#!/usr/bin/env bash
# One-time set-up of .venv: CPU torch first (so nothing pulls a multi-GB CUDA build), then the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# torch 2.13.0 is the CPU build this environment keeps on disk; set TORCH_SPEC to choose another.
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" 2>&1 | grep -v "is ignored" || true
python -m pip install -q -e ".[test]" 2>&1 | grep -v "is ignored" || true
python -W ignore -c "import torch, torchdata, megatron.core, transformers, datasets, mimo_pipes; print('set-up ok: torch', torch.__version__)"
