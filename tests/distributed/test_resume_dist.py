"""Exact resume on every rank over real Gloo groups: at the start, mid-window, on a window boundary, with
windows in flight, at an epoch's end and in the next epoch; overlap on and off; across-micro-batch windows."""

from __future__ import annotations

import pytest
from scenarios_resume import resume_points

# 64 samples / micro-batch 8 = 8 micro-batches per epoch; window 3 puts boundaries at 3, 6, 9, 12: the window of
# micro-batches 6-8 spans the epoch's end, and the stream ends inside the window of 12-14. Each point builds three
# graphs and reads on to STEPS, so a short epoch holds every kind of point at half the reading of 20-batch epochs.
DATASET = 64
STEPS = 14
POINTS = [0, 4, 6, 8, 10]  # start, mid-window, window boundary, end of epoch (mid-window), next epoch (mid-window)

LAYOUTS = {
    "equal-dp": ["language=dp=2", "images=dp=2,rank_offset=2"],
    "dp4-dp2": ["language=dp=4", "images=dp=2,rank_offset=4"],
}


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


def check(results, points):
    for result in filter(None, results):
        for point in points:
            outcome = result["points"][point]
            where = f"{result['module']} dp rank {result['dp_rank']}, restored after {point}"
            assert outcome["full_state"], f"{where}: stream differs from micro-batch {outcome['first_mismatch']}"
            assert outcome["count_only"], f"{where}: resuming from the consumed count alone differs"
            assert outcome["num_yielded"] == STEPS, f"{where}: num_yielded {outcome['num_yielded']}"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("overlap", [True, False])
def test_resume_reproduces_the_stream(pool, layout, overlap):
    results = pool.run(resume_points, LAYOUTS[layout], steps=STEPS, points=POINTS, dataset_size=DATASET, micro_batch_size=8,
                       window_size=3, overlap=overlap, seed=2)
    check(results, POINTS)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_resume_with_across_microbatch_windows(pool, layout):
    # 64 samples: epochs of 8 micro-batches, so step 8 starts both a window and the second epoch. Points: the start,
    # one into a window, that boundary, two into the first window of the second epoch.
    points = [0, 5, 8, 10]
    results = pool.run(resume_points, LAYOUTS[layout], steps=12, points=points, dataset_size=64, micro_batch_size=8,
                       window_size=4, across=True, global_batch_size=32, overlap=True, seed=4)
    for result in filter(None, results):
        for point in points:
            assert result["points"][point]["full_state"] and result["points"][point]["count_only"], (result, point)


def test_resume_without_reordering(pool):
    results = pool.run(resume_points, LAYOUTS["dp4-dp2"], steps=STEPS, points=POINTS, dataset_size=DATASET, micro_batch_size=8, reorder=False,
                       seed=6)
    check(results, POINTS)


@pytest.mark.parametrize("saved_with, restored_with", [(True, False), (False, True)])
def test_resume_may_switch_the_overlap(pool, saved_with, restored_with):
    # `run --resume` lets --no-overlap-intra-microbatch-reorder change: the state and the stream are the same
    points = [4, 6]
    results = pool.run(resume_points, LAYOUTS["equal-dp"], steps=10, points=points, micro_batch_size=8, window_size=3,
                       overlap=saved_with, restore_overlap=restored_with, seed=8)
    for result in filter(None, results):
        for point in points:
            assert result["points"][point]["full_state"] and result["points"][point]["count_only"], (result, point)
