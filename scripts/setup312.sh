#!/usr/bin/env bash
# One-time set-up of .venv312, the Python 3.12 environment of the megatron-core 0.19 tier: what Megatron users run
# (M-RoPE, packing, module_to_grid_map, per-sample split sizes need megatron-core 0.19, and 0.19 needs Python 3.12).
# It installs torch as the package index serves it for Python 3.12 (a CUDA build: about 1.1 GB to download; it runs
# on a CPU too, and on a GPU machine it is the build that uses the GPU), megatron-core 0.19.2, this worktree with
# its test and energon extras, and Megatron-Bridge 0.6.2 (its MIMO training loop, which the Bridge integration's
# tests run). Quiet when it works; prints pip's own output when a step fails.
#
# Megatron-Bridge is installed without its dependencies (--no-deps): its metadata pulls GPU-only builds and
# services that its MIMO loop never imports on a CPU (transformer-engine, flashinfer, fast-hadamard-transform,
# flash-linear-attention, mamba-ssm, causal-conv1d, nvidia-resiliency-ext; wandb, mlflow, comet-ml; diffusers,
# timm, open-clip-torch, qwen-vl-utils, ...), gigabytes to download and some to build. Added instead: the few
# pure-Python packages its MIMO modules import at import time (omegaconf; nvidia-modelopt, which its eval module
# imports, with the modules modelopt's distillation plugin imports: pulp, orloge, cpsat_logutils, scipy). What stays
# unimportable on a CPU machine (transformer_engine, nvidia_resiliency_ext.inprocess) is stood in for by the tests
# (tests/helpers/bridge_cpu.py), never by the library. Bridge pins transformers to 5.8-5.12.1: held there in the one
# resolve, with torchvision (that transformers' Qwen2-VL image processor needs it; the build for the same torch).
# PYTHON312 names the interpreter (default: pyenv's 3.12.1 where pyenv has it, else python3.12 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON312:-}" ]; then
    # pyenv's list read whole first: under pipefail, `grep -q` closing the pipe early could fail pyenv with SIGPIPE.
    versions=$(command -v pyenv >/dev/null 2>&1 && pyenv versions --bare 2>/dev/null || true)
    if grep -qx '3.12.1' <<<"$versions"; then
        PYTHON312="env PYENV_VERSION=3.12.1 python3.12"
    else
        PYTHON312=python3.12
    fi
fi
if [ ! -x .venv312/bin/python ]; then
    $PYTHON312 -m venv .venv312
fi
py=.venv312/bin/python
SETUP_NAME=.venv312
. scripts/quiet_step.sh
step "$py" -m pip install -q --upgrade pip
compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); fi
# One resolve for everything: torch comes as the index serves it for 3.12 (TORCH312_SPEC chooses another).
step "$py" -m pip install -q ${compile[@]+"${compile[@]}"} "${TORCH312_SPEC:-torch}" torchvision "megatron-core==0.19.2" \
    "transformers>=5.8,<=5.12.1" -e ".[test,energon]"
# BRIDGE_SPEC chooses another Megatron-Bridge release or a wheel file.
step "$py" -m pip install -q --no-deps ${compile[@]+"${compile[@]}"} "${BRIDGE_SPEC:-megatron-bridge==0.6.2}" \
    "omegaconf>=2.3.0" "antlr4-python3-runtime==4.9.*" nvidia-modelopt pulp orloge cpsat_logutils scipy
"$py" -W ignore -c "import torch, torchdata, megatron.core, megatron.energon, transformers, mimo_pipes; from importlib.metadata import version; print('set-up of .venv312 ok: Python', __import__('platform').python_version(), 'torch', torch.__version__, 'megatron-core', version('megatron-core'), 'megatron-bridge', version('megatron-bridge'))"
