"""Module graphs over real Gloo process groups, for every layout docs/design.md names: scalable reading
without reordering, then the balance exchange."""

from __future__ import annotations

import pytest
from layout_checks import baseline_spread, check_fanout, check_invariants, vision_spread
from scenarios_exchange import run_graph, run_thread_lifecycle

from mimo_pipes.parallel.sharding import global_microbatch_indices


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


LAYOUTS = {
    "lang2-img2": (["language=dp=2", "images=dp=2,rank_offset=2"], 8),
    "lang4-img2": (["language=dp=4", "images=dp=2,rank_offset=4"], 8),
    "lang4-img1": (["language=dp=4", "images=dp=1,rank_offset=4"], 8),
    "lang3-img1": (["language=dp=3", "images=dp=1,rank_offset=3"], 6),
    "lang-tp2": (["language=tp=2,dp=2", "images=dp=2,rank_offset=4"], 8),
    "lang-pp2": (["language=pp=2,dp=2", "images=dp=2,rank_offset=4"], 8),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_scalable_shards_union_to_the_global_microbatch(pool, name):
    components, batch = LAYOUTS[name]
    steps = 5
    results = pool.run(run_graph, components, steps=steps, micro_batch_size=batch, seed=11, reorder=False)
    check_invariants(results, micro_batch_size=batch, seed=11)  # union over DP ranks == non-scalable reader
    check_fanout(results, "images")
    for result in filter(None, results):
        dp_rank, dp_size = result["dp_rank"], result["dp_size"]
        per_rank = batch // dp_size
        own = sorted(
            int(i)
            for step in range(steps)
            for i in global_microbatch_indices(step, 4096, batch, 11, True)[dp_rank * per_rank : (dp_rank + 1) * per_rank]
        )
        assert result["reads"] == own, f"{result['module']} dp rank {dp_rank} read outside its canonical shard"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_conserves_agrees_and_balances(pool, name):
    components, batch = LAYOUTS[name]
    steps = 12
    results = pool.run(run_graph, components, steps=steps, micro_batch_size=batch, seed=3)
    check_invariants(results, micro_batch_size=batch, seed=3)
    check_fanout(results, "images")
    language_dp = next(r["dp_size"] for r in results if r and r["module"] == "language")
    after = vision_spread(results, "language")
    before = baseline_spread(language_dp, steps, micro_batch_size=batch, seed=3)
    assert after < before, f"{name}: reordering did not lower the mean vision spread ({before} -> {after})"


@pytest.mark.parametrize("window_size", [2, 3])
@pytest.mark.parametrize("overlap", [True, False])
def test_windows_with_short_last_window(pool, window_size, overlap):
    # single sampler over 88 samples = 11 micro-batches of 8: the last window is short for W=2 and W=3.
    components, batch = LAYOUTS["lang4-img2"]
    results = pool.run(
        run_graph, components, steps=100, micro_batch_size=batch, seed=5, window_size=window_size,
        overlap=overlap, dataloader_type="single", dataset_size=88,
    )
    sequences = check_invariants(results, micro_batch_size=batch, seed=5, shuffle=False, dataset_size=88)
    assert len(sequences["language"]) == 11
    check_fanout(results, "images")


def test_across_microbatch_windows(pool):
    components, batch = LAYOUTS["lang2-img2"]
    steps = 16
    results = pool.run(
        run_graph, components, steps=steps, micro_batch_size=batch, seed=7, window_size=4, across=True,
        global_batch_size=batch * 4,
    )
    sequences = check_invariants(results, micro_batch_size=batch, seed=7, window_size=4, across=True)
    check_fanout(results, "images")
    original_step = {
        int(i): step for step in range(steps) for i in global_microbatch_indices(step, 4096, batch, 7, True)
    }
    moved = sum(1 for step, ids in sequences["language"].items() for sid in ids if original_step[sid] != step)
    assert moved > 0, "no sample changed micro-batch inside its window"


def test_prefetch_depth_and_thread_lifecycle(pool):
    results = pool.run(run_thread_lifecycle, ["language=dp=2", "images=dp=2,rank_offset=2"])
    for report in filter(None, results):
        assert 1 <= report["max_held"] <= report["depth"], report  # prefetch happens, and stays bounded
        # one exchange thread and the loader's read-ahead thread (collation runs on it): replaced, not added
        assert report["threads_after_reset"] == ["mimo-pipes-exchange", "mimo-pipes-read-ahead"]
        assert report["threads_after_delete"] == []
        assert report["consumed_to_end"] == 10
        assert report["threads_after_end"] == []
