set -uo pipefail
export OMP_NUM_THREADS=4
python3 -m pip install -q --no-deps .wheels/*.whl >/tmp/i.log 2>&1 || tail -3 /tmp/i.log
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/i2.log 2>&1 || tail -3 /tmp/i2.log
echo "== NCCL exchange tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_nccl_exchange.py 2>&1 | tail -3
echo "== NCCL exchange bandwidth, pinned staging"
timeout 150 python3 benchmarks/exchange.py --backend nccl --rounds 0 --no-docs --out $OUT/nccl_bw >$OUT/bench_nccl_bw.log 2>&1; echo "rc $?"; grep -A4 "exchange / raw" $OUT/bench_nccl_bw.log | head -12
