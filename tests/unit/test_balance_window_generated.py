"""The across-micro-batch planner on generated windows with many equal costs (text-only zeros, images on a
few resolutions): every plan is a valid permutation of the window and never worse than per-micro-batch LPT;
on windows of the kind the planner was once 6.5% above the best plan on (4 micro-batches of 16 samples over
8 slots, many text-only), and on held-out windows of that kind and its neighbours (other W, B, G, text
shares, resolutions, floors), it is within 1% of the optimum the search over counts proves."""

from __future__ import annotations

import numpy as np
import pytest
from balance_oracles import assert_window_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_window
from mimo_pipes.balance.heuristics.lpt import lpt_members
from mimo_pipes.balance.quality import window_path_bound
from mimo_pipes.balance.search.count_search import search_counts

RESOLUTIONS = (64, 144, 256, 576, 1024, 1600, 2304, 4096)


def _path(flat: list[int], plan: list[list[list[int]]], floor: int) -> int:
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)


def _lpt_path(costs: list[list[int]], num_slots: int, floor: int) -> int:
    total = 0
    for row in costs:
        ordered = sorted(row, reverse=True)
        members = lpt_members(np.asarray(ordered, dtype=np.int64), num_slots)
        total += max(floor, max(sum(ordered[r] for r in slot) for slot in members.tolist()))
    return total


@st.composite
def windows(draw):
    """(costs per micro-batch, G, floor): W 2-8, G 2-16, 1-4 samples per slot (at most 256 samples), a
    text-only share up to 80%, image costs from a few resolutions (many ties) or free, with or without a floor."""
    count, num_slots, per_slot = draw(st.integers(2, 8)), draw(st.integers(2, 16)), draw(st.integers(1, 4))
    while count * num_slots * per_slot > 256:
        num_slots = max(2, num_slots // 2)
        per_slot = max(1, per_slot - 1)
    size = num_slots * per_slot
    text = draw(st.sampled_from([0.0, 0.3, 0.6, 0.8]))
    values = draw(st.one_of(
        st.lists(st.sampled_from(RESOLUTIONS), min_size=1, max_size=4),
        st.just(None),
    ))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    image = rng.choice(values, size=(count, size)) if values else (rng.pareto(1.2, (count, size)) * 300 + 1).astype(np.int64)
    costs = np.where(rng.random((count, size)) < text, 0, image).astype(np.int64)
    floor = int(costs.sum() / (count * num_slots) * draw(st.sampled_from([0.0, 0.8])))
    return costs.tolist(), num_slots, floor


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(windows())
def test_plans_are_permutations_and_never_worse_than_lpt(case):
    costs, num_slots, floor = case
    count, size = len(costs), len(costs[0])
    plan = balance_window(costs, num_slots, across_microbatches=True, floor=floor)
    assert_window_plan(plan, count, size, num_slots)
    flat = [c for row in costs for c in row]
    assert _path(flat, plan, floor) <= _lpt_path(costs, num_slots, floor)
    # The same plan twice (ties in any order would break it) is test_balance_window_mixed's to check, on
    # windows as tied as these: planning each one a second time here doubled this test's cost.


def _reported_kind(seed: int) -> list[list[int]]:
    """4 micro-batches of 16 samples, about 60% text-only, images on three resolutions."""
    rng = np.random.default_rng(seed)
    image = rng.choice((256, 576, 1024), size=(4, 16))
    return np.where(rng.random((4, 16)) < 0.6, 0, image).tolist()


def _within_1_percent_of_the_optimum(costs: list[list[int]], num_slots: int, floor: int, path: int) -> bool:
    """Whether ``path`` is at most 1% above the least path of any plan: the lower bound shows it, or the search
    over counts (a budget far beyond the planner's) proves that no plan's path is below path / 1.01. Asked
    for no better plan than that, the search prunes more than one asked for the optimum itself."""
    ordered = sorted((c for row in costs for c in row), reverse=True)
    lower = window_path_bound(np.asarray(ordered, dtype=np.int64), len(costs), num_slots, floor)
    target = -(-path * 100 // 101)  # the least P with P * 1.01 >= path
    if target <= lower:
        return True
    exact = search_counts(ordered, len(costs), num_slots, floor, target, lower, 10**9)
    assert exact.proven
    return exact.bins is None  # none below target: the optimum is at least path / 1.01


def test_a_window_of_the_reported_kind_is_within_1_percent_of_the_best_known():
    # Windows on which a search over labelled micro-batches alone stayed 5.6-13.9% above the best plan (1, 2, 7),
    # windows the search over bins left 2.5-11% above it on half the budget (10, 14, 41, 57), and the one both
    # searches over samples left 11% above it on their budgets (96: 3200 against 2880).
    for seed in (1, 2, 7, 10, 14, 41, 57, 96):
        costs = _reported_kind(seed)
        flat = [c for row in costs for c in row]
        path = _path(flat, balance_window(costs, 8, across_microbatches=True), 0)
        assert _within_1_percent_of_the_optimum(costs, 8, 0, path), (seed, path)


# Held-out windows of few distinct costs (seeds no budget or bound was tuned on): W, B, G, text-only share,
# image resolutions, floor as a fraction of the mean slot load.
HELD_OUT_KINDS = (
    (4, 16, 8, 0.6, (256, 576, 1024), 0.0),  # the reported kind
    (2, 32, 8, 0.6, (256, 576, 1024), 0.0),
    (4, 16, 4, 0.6, (64, 256, 1024, 4096), 0.0),
    (3, 24, 8, 0.5, (144, 576, 1600), 0.5),
    (5, 8, 4, 0.7, (256, 1024), 0.8),
    (8, 8, 4, 0.6, (144, 256, 576, 1024), 0.0),
    (4, 12, 4, 0.3, (576, 1024, 1600), 0.0),
    (8, 16, 8, 0.6, (256, 576, 1024), 0.0),  # 128 samples: the search over counts is its only search
)


def _held_out(kind: tuple, seed: int) -> tuple[list[list[int]], int, int]:
    count, size, num_slots, text, resolutions, floor_share = kind
    rng = np.random.default_rng((HELD_OUT_KINDS.index(kind), 7_000 + seed))
    image = rng.choice(resolutions, size=(count, size))
    costs = np.where(rng.random((count, size)) < text, 0, image)
    return costs.tolist(), num_slots, int(costs.sum() / (count * num_slots) * floor_share)


@pytest.mark.parametrize("kind", HELD_OUT_KINDS, ids=lambda kind: "{}x{}/{}".format(*kind[:3]))
def test_held_out_windows_of_few_costs_are_within_1_percent_of_their_optimum(kind):
    for seed in range(25):
        costs, num_slots, floor = _held_out(kind, seed)
        flat = [c for row in costs for c in row]
        path = _path(flat, balance_window(costs, num_slots, across_microbatches=True, floor=floor), floor)
        assert _within_1_percent_of_the_optimum(costs, num_slots, floor, path), (kind, seed, path)
