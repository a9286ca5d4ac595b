#!/usr/bin/env bash
# One-time set-up of .venv on Python 3.11 (PYTHON, default python3): torch 2.13.0's CPU build first (so nothing pulls
# a multi-GB CUDA build; the wheel this environment keeps on disk is for Python 3.11), megatron-core 0.16.1 and the
# package with its test and energon extras. Python 3.12 with megatron-core 0.19.2 is scripts/setup312.sh (.venv312),
# where torch comes as the package index serves it for 3.12: a CUDA build, which runs on the CPU too.
# Quiet when it works; prints pip's own output when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if [ -z "${TORCH_SPEC:-}" ] && python -c 'import sys; sys.exit(sys.version_info[:2] == (3, 11))'; then
    echo "scripts/setup.sh: .venv has Python $(python -c 'import platform; print(platform.python_version())'); torch 2.13.0's CPU build here is for 3.11 (Python 3.12: bash scripts/setup312.sh, or set TORCH_SPEC)" >&2
    exit 1
fi
SETUP_NAME=.venv
. scripts/quiet_step.sh
step python -m pip install -q --upgrade pip
# pip compiles every module it installs (transformers alone has some 3,000, most of them models never imported):
# a third of the set-up. Where Python may write compiled modules, it compiles the ones imported, once, as they are
# first imported; where it may not (PYTHONDONTWRITEBYTECODE set), pip compiles them all here, as usual.
compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); fi
# torch 2.13.0 is the CPU build this environment keeps on disk; set TORCH_SPEC to choose another.
step python -m pip install -q ${compile[@]+"${compile[@]}"} "${TORCH_SPEC:-torch==2.13.0}"
# CI tests the oldest megatron-core the package admits; the GPU machine runs the newest (set MEGATRON_CORE_SPEC).
step python -m pip install -q ${compile[@]+"${compile[@]}"} -e ".[test,energon,s3]" "${MEGATRON_CORE_SPEC:-megatron-core==0.16.1}"
python -W ignore -c "import torch, torchdata, megatron.core, megatron.energon, transformers, datasets, mimo_pipes; print('set-up ok: torch', torch.__version__)"
