#!/usr/bin/env bash
# On a host with two GPUs: the NCCL exchange tests, the exchange benchmark over NCCL and over Gloo (with
# cores to spare), and `mimo-pipes run` on 2 GPU ranks. Results go under OUT (default ./gpu-results).
# Packages the host lacks can be put as wheels in WHEELS (installed with --no-deps).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
export OMP_NUM_THREADS=4
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-deps "$WHEELS"/*.whl >/tmp/install.log 2>&1 || tail -5 /tmp/install.log
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install-self.log 2>&1 || tail -5 /tmp/install-self.log
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'; } \
    >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
echo "== NCCL exchange tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/distributed/test_nccl_exchange.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
for part in overlap memory bandwidth metrics_cost; do
    echo "== exchange benchmark ($part), NCCL"
    timeout 420 python3 benchmarks/exchange_$part.py --backend nccl --no-docs --out "$OUT/nccl" >"$OUT/${part}_nccl.log" 2>&1
    tail -3 "$OUT/${part}_nccl.log"
    echo "== exchange benchmark ($part), Gloo with cores to spare"
    timeout 420 python3 benchmarks/exchange_$part.py --no-docs --out "$OUT/gloo" >"$OUT/${part}_gloo.log" 2>&1
    tail -3 "$OUT/${part}_gloo.log"
done
echo "== mimo-pipes run on 2 GPU ranks"
timeout 300 python3 -m mimo_pipes.cli.main run --component language=dp=2 --scalable-dp --intra-microbatch-reorder \
    --steps 16 --quiet --dump-assignments /tmp/dumps >"$OUT/run.log" 2>&1; echo "exit $?" >>"$OUT/run.log"
tail -8 "$OUT/run.log"
