"""The run summary's "before" is what the ranks consume with reordering off, also when samples move across
the micro-batches of a window: consumed samples are grouped by the step and slot they were read at."""

from __future__ import annotations

import pytest
from scenarios_summary import run_summary_records

from mimo_pipes.observe.summary import summarize

LAYOUTS = {
    "lang2+img1": ["language=dp=2", "images=dp=1,rank_offset=2"],
    "lang2+img2": ["language=dp=2", "images=dp=2,rank_offset=2"],
    "lang4+img2": ["language=dp=4", "images=dp=2,rank_offset=4"],
}
BATCH, STEPS, SEED = 8, 8, 21


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


def _summaries(results, grid_size):
    return {s.module: s for s in summarize((r for records in results if records for r in records), grid_size)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_before_under_across_moves_is_the_run_with_reordering_off(pool, layout):
    components = LAYOUTS[layout]
    grid = 4 if "lang4" in layout else 2
    off = _summaries(pool.run(run_summary_records, components, steps=STEPS, micro_batch_size=BATCH, seed=SEED, reorder=False), grid)
    for window in (2, 4):
        results = pool.run(run_summary_records, components, steps=STEPS, micro_batch_size=BATCH, seed=SEED, reorder=True,
                           window_size=window, across=True)
        moved = [step for records in results if records for r in records for step in r["read_steps"] if step != r["step"]]
        assert moved, f"window {window}: no sample moved across micro-batches, the comparison would prove nothing"
        across = _summaries(results, grid)
        assert set(across) == set(off) == {"language", "images"}
        for module, summary in across.items():
            reference = off[module]
            assert summary.steps == reference.steps == STEPS
            assert (summary.mean_spread_before, summary.max_rank_tokens_before) == (
                reference.mean_spread_after, reference.max_rank_tokens_after), f"{module}, window {window}"
            assert (reference.mean_spread_before, reference.max_rank_tokens_before) == (
                reference.mean_spread_after, reference.max_rank_tokens_after)  # off: before is after
            if summary.dp_size > 1:
                assert summary.max_rank_tokens_after < summary.max_rank_tokens_before, f"{module}, window {window}: no gain"
