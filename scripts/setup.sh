#!/usr/bin/env bash
# One-time set-up of .venv: CPU torch first (so nothing pulls a multi-GB CUDA build), then the package.
# Quiet when it works; prints pip's own output when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
log=$(mktemp)
trap 'rm -f "$log"' EXIT
step() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "set-up failed: $*" >&2
        exit 1
    fi
}
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
