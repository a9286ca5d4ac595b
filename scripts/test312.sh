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
# glibc's malloc maps every block over 32 MiB (megatron-core's attention scores at these sequence lengths, their
# softmax and gradients) afresh and unmaps it when freed, so each one faults its memory in again page by page: the
# kernel's share was a third of the tier's CPU time. Transparent huge pages for those mappings (madvise, where the
# kernel offers them; ignored by a glibc before 2.35) fault them in 2 MiB at a time: a warm three-iteration run of
# the non-colocated recipe on three ranks took 12 CPU-s instead of 17.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1"
# Every pool's ranks forked from one process that imported, once, what the ten ranks would import each: the Megatron
# scenarios (torch, transformers and the recipes), megatron-core and Megatron-Bridge (the scenarios import them
# lazily: tests/helpers/megatron_preload.py, which also says why Bridge's import leaves the other scenarios as they
# were) and datasets (the embedded data's reader); tests/helpers/dist_pool.py, PRELOAD.
export MIMO_PIPES_TEST_POOL_PRELOAD=scenarios_megatron_equivalence,scenarios_megatron_packing,scenarios_megatron_bridge,scenarios_megatron_resume,scenarios_megatron_routing,datasets,megatron_preload
# The routing and resume scenarios share the warm pool of tests/helpers/dist_pool.py (6 ranks); the equivalence
# tests (packing's among them) train in pools of exactly each recipe's world (1 rank, 3, and that pool's 6), each
# started once for the run.
SECONDS=0
status=0
.venv312/bin/python -m pytest -q -p no:cacheprovider --durations=10 -m "not launch" \
    tests/unit/test_megatron_*.py tests/distributed/test_megatron_*.py "$@" || status=$?
echo "python 3.12 tier (megatron-core 0.19.2): ${SECONDS}s"
exit "$status"
