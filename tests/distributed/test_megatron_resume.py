"""Megatron's consumed_train_samples and the pipeline's consumed micro-batches, both ways; a graph restarted from
the mapped count continues the stream (real Gloo ranks)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scenarios_megatron_resume import restart_from_consumed_samples

from mimo_pipes.megatron import microbatches_from_samples, samples_from_microbatches


@given(microbatches=st.integers(0, 10**9), size=st.integers(1, 4096))
def test_the_two_counts_map_both_ways(microbatches, size):
    samples = samples_from_microbatches(microbatches, size)
    assert microbatches_from_samples(samples, size) == microbatches


@given(samples=st.integers(0, 10**6), size=st.integers(2, 512))
def test_a_count_that_is_not_whole_micro_batches_is_refused(samples, size):
    if samples % size:
        with pytest.raises(ValueError, match=f"consumed_train_samples {samples} is not a multiple of the global micro-batch size {size}"):
            microbatches_from_samples(samples, size)
    else:
        assert microbatches_from_samples(samples, size) * size == samples


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_counts_and_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="consumed_train_samples must be"):
        microbatches_from_samples(bad, 8)
    with pytest.raises(ValueError, match="global micro-batch size"):
        samples_from_microbatches(3, bad if bad != 1.5 else 0)


@pytest.mark.parametrize("stop_after", [1, 2])
def test_a_graph_restarted_from_consumed_train_samples_continues_the_stream(gloo_pool, stop_after):
    # 3 micro-batches per iteration, windows of 2: a checkpoint after iteration 1 falls inside a window
    results = gloo_pool.run(restart_from_consumed_samples, ["language=dp=2", "images=dp=2,rank_offset=2"], microbatches_per_iteration=3,
                            iterations=4, stop_after=stop_after, micro_batch_size=8, window_size=2, seed=3)
    for result in filter(None, results):
        assert result["consumed"] == 3 * stop_after and result["num_yielded_at_start"] == 3 * stop_after
        assert result["continues"] and result["back_to_samples"], result
        assert result["steps"] == list(range(3 * stop_after, 12))
