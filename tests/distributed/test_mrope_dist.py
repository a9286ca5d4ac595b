"""Three-row (M-RoPE) position ids through balance_iterator on real Gloo ranks: every sample keeps its own
three rows across the exchange, padded and packed, in the layout they came in."""

from __future__ import annotations

import pytest
from layout_checks import check_invariants
from scenarios_mrope import run_three_row_positions

LAYOUT = ["language=dp=2", "images=dp=2,rank_offset=2"]
BATCH = 8


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


@pytest.mark.parametrize("pack_sequences", [False, True])
@pytest.mark.parametrize("mrope_first", [False, True])
def test_three_row_position_ids_follow_their_samples(pool, mrope_first, pack_sequences):
    results = pool.run(run_three_row_positions, LAYOUT, steps=6, micro_batch_size=BATCH, seed=5, mrope_first=mrope_first,
                       pack_sequences=pack_sequences)
    check_invariants(results, micro_batch_size=BATCH, seed=5)
