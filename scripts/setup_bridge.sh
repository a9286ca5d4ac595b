#!/usr/bin/env bash
# Megatron-Bridge 0.6.2 into .venv312 (made by scripts/setup312.sh) for the Python 3.12 tier's Bridge tests.
# Bridge is installed without its dependencies: its metadata pulls GPU-only and service packages the MIMO path never
# needs on a CPU (flashinfer, transformer-engine, fast-hadamard-transform, flash-linear-attention, wandb, mlflow,
# comet-ml, diffusers, timm, open-clip-torch, nvidia-resiliency-ext, ...). Added instead: the few pure-Python packages
# its MIMO training modules import at import time (omegaconf; nvidia-modelopt, which its eval module imports, with the
# modules modelopt's distillation plugin imports). What remains unimportable on a CPU machine (transformer_engine,
# nvidia_resiliency_ext.inprocess) is stood in for by the tests (tests/helpers/bridge_cpu.py), never by the library.
# Bridge pins transformers to 5.8-5.12.1: held there, whose Qwen2-VL image processor needs torchvision (the build made
# for the installed torch, so pip may not swap torch).
# Quiet when it works; prints pip's own output when a step fails. BRIDGE_SPEC chooses another release or a wheel file.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv312/bin/python
if [ ! -x "$py" ]; then
    echo "set-up of Megatron-Bridge: .venv312 is missing; run scripts/setup312.sh first" >&2
    exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
step() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "set-up of Megatron-Bridge failed: $*" >&2
        exit 1
    fi
}
compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); fi
step "$py" -m pip install -q --no-deps ${compile[@]+"${compile[@]}"} "${BRIDGE_SPEC:-megatron-bridge==0.6.2}" \
    "omegaconf>=2.3.0" "antlr4-python3-runtime==4.9.*" nvidia-modelopt pulp orloge cpsat_logutils scipy
torch_version=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
step "$py" -m pip install -q ${compile[@]+"${compile[@]}"} "transformers>=5.8,<=5.12.1" torchvision "torch==$torch_version"
"$py" -W ignore -c "from importlib.metadata import version; print('set-up of Megatron-Bridge ok:', version('megatron-bridge'), 'transformers', version('transformers'))"
