"""Megatron's consumed_train_samples and the pipeline's consumed micro-batches, both ways, by Megatron's names; a graph
restarted from the mapped count, or from the pipeline state saved inside a Megatron iteration folder, continues the
stream (real Gloo ranks)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scenarios_megatron_resume import restart_from_consumed_samples, resume_from_iteration_folders

from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron import global_microbatch_size, microbatches_from_samples, samples_from_microbatches


@given(microbatches=st.integers(0, 10**9), per_rank=st.integers(1, 64), dp=st.integers(1, 64), steps=st.integers(1, 16))
def test_the_two_counts_map_both_ways(microbatches, per_rank, dp, steps):
    sizes = {"global_batch_size": per_rank * dp * steps, "micro_batch_size": per_rank, "data_parallel_size": dp}
    samples = samples_from_microbatches(consumed_microbatches=microbatches, **sizes)
    assert samples == microbatches * per_rank * dp
    assert microbatches_from_samples(consumed_train_samples=samples, **sizes) == microbatches


@given(samples=st.integers(0, 10**6), per_rank=st.integers(1, 32), dp=st.integers(1, 16))
def test_a_count_that_is_not_whole_micro_steps_is_refused(samples, per_rank, dp):
    step = per_rank * dp
    sizes = {"global_batch_size": step * 4, "micro_batch_size": per_rank, "data_parallel_size": dp}
    if samples % step:
        with pytest.raises(ConfigError, match=f"^consumed_train_samples: {samples} is not a multiple of micro_batch_size x data_parallel_size = {step}"):
            microbatches_from_samples(consumed_train_samples=samples, **sizes)
    else:
        assert microbatches_from_samples(consumed_train_samples=samples, **sizes) * step == samples


def test_megatrons_per_rank_size_is_not_mistaken_for_the_global_one():
    """Megatron-LM's --micro-batch-size 2 on 4 DP ranks: 8 samples a micro-step, so 96 consumed samples are 12
    micro-batches (dividing by the per-rank 2 would resume at 48, four times too far, silently)."""
    assert microbatches_from_samples(consumed_train_samples=96, global_batch_size=32, micro_batch_size=2, data_parallel_size=4) == 12
    assert global_microbatch_size(micro_batch_size=2, data_parallel_size=4) == 8
    with pytest.raises(TypeError):
        microbatches_from_samples(96, 2)  # positional values are refused: every value by its Megatron name


@pytest.mark.parametrize(("sizes", "argument"), [
    ({"global_batch_size": 12, "micro_batch_size": 2, "data_parallel_size": 4}, "global_batch_size"),
    ({"global_batch_size": 0, "micro_batch_size": 2, "data_parallel_size": 4}, "global_batch_size"),
    ({"global_batch_size": 16, "micro_batch_size": 0, "data_parallel_size": 4}, "micro_batch_size"),
    ({"global_batch_size": 16, "micro_batch_size": 2, "data_parallel_size": -1}, "data_parallel_size"),
])
def test_inconsistent_sizes_are_refused_naming_the_argument(sizes, argument):
    for call in (lambda: microbatches_from_samples(consumed_train_samples=16, **sizes), lambda: samples_from_microbatches(consumed_microbatches=2, **sizes)):
        with pytest.raises(ConfigError) as error:
            call()
        assert error.value.setting == argument and "\n" not in str(error.value)


@pytest.mark.parametrize("stop_after", [1, 2])
def test_a_graph_restarted_from_consumed_train_samples_continues_the_stream(gloo_pool, stop_after):
    # 3 micro-batches per iteration, windows of 2: a checkpoint after iteration 1 falls inside a window
    results = gloo_pool.run(restart_from_consumed_samples, ["language=dp=2", "images=dp=2,rank_offset=2"], microbatches_per_iteration=3,
                            iterations=4, stop_after=stop_after, micro_batch_size=8, window_size=2, seed=3)
    for result in filter(None, results):
        assert result["consumed"] == 3 * stop_after and result["num_yielded_at_start"] == 3 * stop_after
        assert result["continues"] and result["back_to_samples"], result
        assert result["steps"] == list(range(3 * stop_after, 12))


@pytest.mark.parametrize("resume_components", [
    ["language=dp=2", "images=dp=2,rank_offset=2"],
    ["language=dp=1", "images=dp=1,rank_offset=1"],  # other layouts of the same modules
    ["language=dp=4", "images=dp=2,rank_offset=4"],
], ids=["same-layout", "smaller-layout", "larger-layout"])
def test_the_state_in_megatrons_iteration_folder_resumes_exactly_after_failed_and_uncommitted_saves(gloo_pool, tmp_path, resume_components):
    """Iteration 2 committed; iteration 3's save failed on rank 1 (refused on every rank); iteration 4's state
    written but the job died before Megatron's tracker: every rank resumes at iteration 2 (micro-batch 6, inside a
    window of 4) and continues the uninterrupted stream."""
    results = gloo_pool.run(resume_from_iteration_folders, ["language=dp=2", "images=dp=2,rank_offset=2"], resume_components,
                            directory=str(tmp_path), microbatches_per_iteration=3, iterations=5, save_at=2, micro_batch_size=8,
                            window_size=4, seed=4, failing_rank=1)
    ran = [result for result in results if result is not None]
    assert len(ran) == sum(int(spec.split("dp=")[1].split(",")[0]) for spec in resume_components)
    for result in ran:
        assert result["latest"] == 2 and result["continues"], result
        assert result["steps"] == list(range(6, 15))
    saving = [result["refusals"] for result in ran if "refusals" in result]
    assert len(saving) == min(4, len(ran)) and all(len(refusals) == 1 for refusals in saving)
    assert all("iteration 3 was not saved" in refusals[0] and "rank 1" in refusals[0] and "No space left" in refusals[0] for refusals in saving)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["iter_0000002", "iter_0000003", "iter_0000004", "latest_checkpointed_iteration.txt"]
