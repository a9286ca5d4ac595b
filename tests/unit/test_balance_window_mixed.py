"""The across-micro-batch planner on mixed text-and-image windows (``mixed_windows``: 30-45% text-only
samples at cost 0, image costs of ~60-1300 with repeats, W 2-6, G 4-16, 1-3 samples per slot, with and
without a floor): every plan is a permutation with exact slot sizes and the same in every call; small
windows are planned optimally (proved by a branch and bound run to the end); windows of the generator's seeds below are within 3% of
the optimum scipy's MILP (HiGHS) proved for them (stored: scipy is no dependency of the project)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from balance_oracles import assert_window_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mixed_windows import draw_window, path_of, reported_window

from mimo_pipes.balance import balance_window
from mimo_pipes.balance.quality import window_path_bound
from mimo_pipes.balance.search.window_search import search_window
from mimo_pipes.balance.window.tuning import TUNING


@st.composite
def mixed(draw):
    """A mixed window of any shape of the class, from a drawn generator seed."""
    seed = draw(st.integers(0, 2**32 - 1))
    costs, num_slots, floor, _ = draw_window(np.random.default_rng(seed))
    return costs, num_slots, floor


@settings(deadline=None, max_examples=8, suppress_health_check=[HealthCheck.too_slow])  # two plans of up to 288 samples each
@given(mixed())
def test_every_sample_once_slot_sizes_exact_and_the_same_plan_twice(case):
    costs, num_slots, floor = case
    count, size = len(costs), len(costs[0])
    plan = balance_window(costs, num_slots, across_microbatches=True, floor=floor)
    assert_window_plan(plan, count, size, num_slots)
    flat = [c for row in costs for c in row]
    ordered = np.sort(np.asarray(flat, dtype=np.int64))[::-1]
    assert path_of(flat, plan, floor) >= window_path_bound(ordered, count, num_slots, floor)
    assert balance_window(costs, num_slots, across_microbatches=True, floor=floor) == plan


def _optimum(costs: list[list[int]], num_slots: int, floor: int, known: int) -> int:
    """The least critical path, proved by the branch and bound over samples on a budget far beyond the
    planner's (at most ``known``, a path some plan has)."""
    ordered = sorted((c for row in costs for c in row), reverse=True)
    lower = window_path_bound(np.asarray(ordered, dtype=np.int64), len(costs), num_slots, floor)
    exact = search_window(ordered, len(costs), num_slots, floor, known + 1, lower, 10**8)
    assert exact.proven
    return exact.best


@pytest.mark.parametrize("shape", [(2, 4, 2), (3, 4, 2), (2, 5, 2), (2, 4, 3)], ids=str)
def test_small_mixed_windows_are_planned_optimally(shape):
    rng = np.random.default_rng((39, *shape))
    for _ in range(6):
        costs, num_slots, floor, info = draw_window(rng, shape)
        flat = [c for row in costs for c in row]
        path = path_of(flat, balance_window(costs, num_slots, across_microbatches=True, floor=floor), floor)
        assert path == _optimum(costs, num_slots, floor, path), info


# (generator, seed, best path scipy's MILP found, proved optimal): ``reported_window`` or ``draw_window`` on
# np.random.default_rng(seed), each value found by scipy.optimize.milp (HiGHS) over slot patterns in 12 s
# (benchmarks/window_mixed.py's ``milp_path``; its plan is a valid plan, so no planner may need to be more
# than 3% above it). Seeds no constant was tuned on. The planner before its pair searches was 3.5-6.8% above
# the MILP's plan on 3905, 3913, 3915, 3916 and 3920.
KNOWN = (
    ("reported", 3905, 3442, False),
    ("reported", 3913, 3401, False),
    ("reported", 3914, 3345, False),
    ("reported", 3915, 2503, False),
    ("reported", 3916, 3174, False),
    ("reported", 3918, 2590, True),
    ("reported", 3919, 3588, False),
    ("reported", 3920, 2672, False),
    ("drawn", 3951, 4696, True),
    ("drawn", 3953, 3763, True),
    ("drawn", 3955, 2764, True),
    ("drawn", 3958, 4720, True),
    ("drawn", 3962, 4243, True),
    ("drawn", 3967, 10790, False),
    ("drawn", 3968, 5872, True),
    ("drawn", 3971, 2810, True),
)


def _planned_path(generator: str, seed: int) -> tuple[int, dict]:
    """The planner's critical path on the window ``generator`` draws from ``seed``, and the window's description."""
    draw = reported_window if generator == "reported" else draw_window
    costs, num_slots, floor, info = draw(np.random.default_rng(seed))
    flat = [c for row in costs for c in row]
    return path_of(flat, balance_window(costs, num_slots, across_microbatches=True, floor=floor), floor), info


@pytest.mark.parametrize("generator, seed, known, proven", KNOWN, ids=lambda value: str(value))
def test_mixed_windows_are_within_3_percent_of_the_milp_plan(generator, seed, known, proven):
    path, info = _planned_path(generator, seed)
    if proven:
        assert path >= known  # the stored optimum is one
    assert path * 100 <= known * 103, (info, path, known)


# Windows the search over levels settles: (generator, seed, best path scipy's MILP found in 20 s, proved
# optimal), as above. Before that search the planner was 5.1-6.4% above the MILP's plan on every one (the
# pair searches could not move the samples of all four micro-batches at once); the planner now comes within
# 1% of it (on 3998 it is below the MILP's plan, which was not proved).
SETTLED_BY_LEVELS = (
    ("reported", 4001, 2935, False),
    ("reported", 4004, 3224, True),
    ("reported", 4025, 3840, True),
    ("reported", 4040, 2067, True),
    ("reported", 4044, 3180, True),
    ("drawn", 3998, 4602, False),
)


@pytest.mark.parametrize("generator, seed, known, proven", SETTLED_BY_LEVELS, ids=lambda value: str(value))
def test_windows_whose_better_plans_move_samples_among_every_micro_batch_are_within_1_percent(
    generator, seed, known, proven
):
    path, info = _planned_path(generator, seed)
    if proven:
        assert path >= known
    assert path * 100 <= known * 101, (info, path, known)


@settings(deadline=None, max_examples=8, suppress_health_check=[HealthCheck.too_slow])
@given(mixed())
def test_the_search_over_levels_never_leaves_a_plan_worse_than_without_it(case):
    costs, num_slots, floor = case
    flat = [c for row in costs for c in row]
    plan = balance_window(costs, num_slots, across_microbatches=True, floor=floor)
    assert_window_plan(plan, len(costs), len(costs[0]), num_slots)
    without = balance_window(
        costs, num_slots, across_microbatches=True, floor=floor, tuning=replace(TUNING, levels_max_samples=0)
    )
    assert path_of(flat, plan, floor) <= path_of(flat, without, floor)


def test_a_window_the_exact_searches_settle_is_not_searched_pair_by_pair(monkeypatch):
    """Images on a few resolutions (5 distinct costs): the search over counts proves its plan optimal, so the
    pair searches (which could only spend time there) are not run; run first, as ``pairs_after_exact=False``
    asks, they are, and the plan's path is the same."""
    from mimo_pipes.balance.window import planner

    rng = np.random.default_rng(3939)
    flat = rng.choice([64, 256, 576, 1024], size=64)
    flat[rng.permutation(64)[:26]] = 0
    costs = flat.reshape(4, 16).tolist()
    calls = []
    original = planner.pairs_replanned

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(planner, "pairs_replanned", counted)
    path = path_of(flat.tolist(), balance_window(costs, 8, across_microbatches=True), 0)
    assert calls == []
    first = balance_window(costs, 8, across_microbatches=True, tuning=replace(TUNING, pairs_after_exact=False))
    assert calls == [1]
    assert path_of(flat.tolist(), first, 0) == path == _optimum(costs, 8, 0, path)
