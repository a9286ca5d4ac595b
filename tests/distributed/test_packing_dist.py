"""Sequence packing composed with reordering over real Gloo process groups: conservation and module agreement
after packing, every sample intact in the THD row, packed language cost, exact resume, the iterator wrapper."""

from __future__ import annotations

from fractions import Fraction

import pytest
from layout_checks import check_fanout, check_invariants
from scenarios_packing import run_packed_graph, run_wrapper_packed
from scenarios_resume import resume_points
from test_resume_dist import DATASET, POINTS, STEPS, check

from mimo_pipes.config import DEFAULT_ATTENTION_CROSSOVER

LAYOUTS = {
    "lang2-img2": ["language=dp=2", "images=dp=2,rank_offset=2"],
    "lang4-img2": ["language=dp=4", "images=dp=2,rank_offset=4"],
}
BATCH = 8


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("reorder", [True, False])
def test_packing_after_reordering_conserves_and_agrees(pool, name, reorder):
    results = pool.run(run_packed_graph, LAYOUTS[name], steps=8, micro_batch_size=BATCH, seed=3, reorder=reorder, pad_multiple=4)
    check_invariants(results, micro_batch_size=BATCH, seed=3)
    check_fanout(results, "images")
    for result in filter(None, results):
        for record, metrics in zip(result["records"], result["metrics"]):
            assert metrics["real_tokens"] == sum(record["real_tokens"])
            assert metrics["padding_fraction_after"] < metrics["padding_fraction_before"]


def test_packing_with_windows_across_microbatches_and_the_packed_cost(pool):
    crossover = DEFAULT_ATTENTION_CROSSOVER
    results = pool.run(
        run_packed_graph, LAYOUTS["lang4-img2"], steps=12, micro_batch_size=BATCH, seed=7, window_size=4, across=True,
        global_batch_size=BATCH * 4, reorder_language_cost="packed", reorder_language_cost_weight=1.0,
    )
    check_invariants(results, micro_batch_size=BATCH, seed=7, window_size=4, across=True)
    check_fanout(results, "images")
    for result in filter(None, results):
        for record in result["records"]:
            for image, real, cost in zip(record["image_tokens"], record["real_tokens"], record["costs"]):
                # encoder 1 : language 1 : square 1/crossover, on the integer scale crossover
                assert Fraction(cost, crossover) == image + real + Fraction(real * real, crossover)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_resume_is_exact_with_packing(pool, layout):
    results = pool.run(resume_points, LAYOUTS[layout], steps=STEPS, points=POINTS, dataset_size=DATASET, micro_batch_size=BATCH,
                       window_size=3, overlap=True, seed=2, pack_sequences_in_batch=True, pack_pad_multiple=8)
    check(results, POINTS)


def test_resume_is_exact_with_packing_across_microbatches(pool):
    points = [0, 5, 8, 21]
    results = pool.run(resume_points, LAYOUTS["lang2-img2"], steps=24, points=points, micro_batch_size=BATCH, window_size=4,
                       across=True, global_batch_size=32, overlap=True, seed=4, pack_sequences_in_batch=True,
                       reorder_language_cost="packed", reorder_language_cost_weight=0.5)
    for result in filter(None, results):
        for point in points:
            assert result["points"][point]["full_state"] and result["points"][point]["count_only"], (result, point)


@pytest.mark.parametrize("window_size, across", [(1, False), (2, True)])
def test_iterator_wrapper_packs_like_the_graph(pool, window_size, across):
    results = pool.run(run_wrapper_packed, LAYOUTS["lang2-img2"], steps=6, micro_batch_size=BATCH, seed=9,
                       window_size=window_size, across=across)
    check_invariants(results, micro_batch_size=BATCH, seed=9, window_size=window_size, across=across)
    check_fanout(results, "images")
