#!/usr/bin/env bash
# The Python 3.12 tier: megatron-core 0.19.2 (what Megatron users run) in .venv312, every Megatron test and the
# recipes' equivalence tests (the non-colocated recipe against the colocated one, and Megatron-Bridge 0.6.2's own MIMO
# loop fed by the pipeline against the non-colocated recipe, trained on CPU ranks over Gloo).
# Sets .venv312 up first when it is missing (scripts/setup312.sh); SKIP_SETUP312=1 uses it as it is. Works where
# torch has CUDA too: the tier trains on the CPU either way. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SKIP_SETUP312:-}" ] || [ ! -x .venv312/bin/python ]; then
    bash scripts/setup312.sh
fi
unset PYTHONDONTWRITEBYTECODE
# The routing and resume scenarios share the warm pool of tests/helpers/dist_pool.py (6 ranks); the equivalence
# tests (packing's among them) train in pools of exactly each recipe's world (1 rank, 3, and that pool's 6), each
# started once for the run.
SECONDS=0
status=0
.venv312/bin/python -m pytest -q -p no:cacheprovider --durations=10 -m "not launch" \
    tests/unit/test_megatron_*.py tests/distributed/test_megatron_*.py "$@" || status=$?
echo "python 3.12 tier (megatron-core 0.19.2): ${SECONDS}s"
exit "$status"
