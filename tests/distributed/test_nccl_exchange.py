"""The exchange over NCCL (bytes staged through the GPU), on machines with two or more GPUs; skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from dist_pool import DistPool
from layout_checks import baseline_spread, check_invariants, vision_spread
from scenarios_exchange import run_graph

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.fixture(scope="module")
def pool():
    pool = DistPool(2, backend="cpu:gloo,cuda:nccl")
    yield pool
    pool.close()


@pytest.mark.parametrize("window_size", [1, 3])
@pytest.mark.parametrize("overlap", [True, False])
def test_nccl_exchange_conserves_and_balances(pool, overlap, window_size):
    steps = 12
    results = pool.run(run_graph, ["language=dp=2"], steps=steps, micro_batch_size=8, seed=3, overlap=overlap,
                       window_size=window_size, exchange_backend="nccl")
    check_invariants(results, micro_batch_size=8, seed=3)
    assert vision_spread(results, "language") < baseline_spread(2, steps, micro_batch_size=8, seed=3)


def test_nccl_across_microbatch_windows(pool):
    results = pool.run(run_graph, ["language=dp=2"], steps=16, micro_batch_size=8, seed=7, window_size=4, across=True,
                       global_batch_size=32, exchange_backend="nccl")
    check_invariants(results, micro_batch_size=8, seed=7, window_size=4, across=True)
