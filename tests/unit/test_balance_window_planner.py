"""The across-micro-batch window planner's parts: the batched bound, the compositions it ranks, the
pair-filling start, the engine's floor and heaviest-only modes, and floor-aware plans of large windows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_window, critical_path, window_lower_bound
from mimo_pipes.balance.canonical import loads_of, score, sort_order
from mimo_pipes.balance.heuristics.lpt import lpt_members
from mimo_pipes.balance.heuristics.refine import refine_members
from mimo_pipes.balance.microbatch import plan_members
from mimo_pipes.balance.quality import rows_lower_bound, sorted_lower_bound
from mimo_pipes.balance.window.compositions import compositions as window_compositions
from mimo_pipes.balance.window.compositions import filler_counts
from mimo_pipes.balance.window.starts import fill_to_level, pairs_to_level
from mimo_pipes.balance.window.tuning import TUNING

SETTINGS = settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def sorted_rows(draw):
    """(rows sorted heaviest first, G): several micro-batches of one size, with ties and zeros."""
    num_slots = draw(st.integers(1, 6))
    size = num_slots * draw(st.integers(0, 5))
    count = draw(st.integers(1, 4))
    values = st.one_of(st.just(0), st.integers(0, 50), st.integers(0, 10**9))
    rows = [sorted(draw(st.lists(values, min_size=size, max_size=size)), reverse=True) for _ in range(count)]
    return np.asarray(rows, dtype=np.int64).reshape(count, size), num_slots


@st.composite
def window_shapes(draw, max_count: int = 5, max_slots: int = 6, max_per_slot: int = 4):
    count = draw(st.integers(1, max_count))
    num_slots = draw(st.integers(1, max_slots))
    per_slot = draw(st.integers(1, max_per_slot))
    size = count * num_slots * per_slot
    flat = draw(st.lists(st.integers(0, 3000), min_size=size, max_size=size))
    return np.asarray(flat, dtype=np.int64), count, num_slots, draw(st.integers(0, 4000))


def _floored(loads: np.ndarray, floor: int) -> int:
    return int(np.maximum(loads.max(axis=-1), floor).sum())


@SETTINGS
@given(sorted_rows())
def test_rows_lower_bound_is_the_one_row_bound_of_every_row(case):
    rows, num_slots = case
    bounds = rows_lower_bound(rows, num_slots)
    assert bounds.tolist() == [sorted_lower_bound(row, num_slots, thorough=False) for row in rows]


@SETTINGS
@given(window_shapes())
def test_compositions_partition_the_window_into_sorted_rows(case):
    flat, count, num_slots, floor = case
    order = sort_order(flat)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    compositions = list(window_compositions(order, count, num_slots, floor, TUNING))
    size = flat.size // count
    hybrids = max(count - 2, 0) if floor and size > num_slots else 0
    fillers = {1 << i for i in range(size.bit_length()) if 1 << i < size} | set(range(num_slots, size, num_slots))
    assert filler_counts(size, num_slots, TUNING) == sorted(fillers)
    assert len(compositions) == 2 + hybrids + (len(fillers) if count > 1 and size > num_slots else 0)
    for rows in compositions:
        assert rows.shape == (count, flat.size // count)
        assert sorted(rows.reshape(-1).tolist()) == list(range(flat.size))
        # Each row is in the window's sorted order, as the engine and the bound expect.
        assert all((np.diff(rank[row]) > 0).all() for row in rows)
    # A snake deals every chunk of G sorted samples whole to one micro-batch.
    chunks = order.reshape(-1, num_slots)
    owner = {int(i): m for m, row in enumerate(compositions[1]) for i in row}
    assert all(len({owner[int(i)] for i in chunk}) == 1 for chunk in chunks)
    # Runs with f fillers: each micro-batch but the last takes the next B - f heaviest samples and the
    # f lightest left.
    if count > 1 and size > num_slots:
        for f, rows in zip(sorted(fillers), compositions[2 + hybrids :]):
            left = order.tolist()
            for row in rows[:-1]:
                assert row.tolist() == left[: size - f] + left[len(left) - f :]
                left = left[size - f : len(left) - f]
            assert rows[-1].tolist() == left


@SETTINGS
@given(window_shapes(max_count=4, max_per_slot=4))
def test_fill_to_level_opens_the_heaviest_microbatch_with_its_heads(case):
    flat, count, num_slots, floor = case
    window = flat.reshape(count, -1)
    plans = fill_to_level(window, num_slots, floor, opened=1)
    per_slot = window.shape[1] // num_slots
    assert [plan.shape for plan in plans] == [(num_slots, per_slot)] * count
    assert sorted(np.concatenate(plans).reshape(-1).tolist()) == list(range(flat.size))
    order = sort_order(flat)
    # The G heaviest samples open the first micro-batch's slots, one each.
    assert plans[0][:, 0].tolist() == order[:num_slots].tolist()


@SETTINGS
@given(window_shapes(max_per_slot=1))
def test_pairs_to_level_fill_each_microbatch_up_to_its_level(case):
    flat, count, num_slots, floor = case
    flat = np.concatenate((flat, flat[::-1] // 3))  # two samples per slot
    order = sort_order(flat)
    plans = pairs_to_level(flat, order, count, num_slots, floor)
    assert [plan.shape for plan in plans] == [(num_slots, 2)] * count
    assert sorted(np.concatenate(plans).reshape(-1).tolist()) == list(range(flat.size))
    left = order.tolist()  # samples not placed yet, heaviest first
    for plan in plans:
        # The micro-batch opens with the heaviest and the lightest sample left: they set its level.
        assert plan[0].tolist() == [left[0], left[-1]]
        level = max(floor, int(flat[plan[0]].sum()))
        left = left[1:-1]
        for first, second in plan[1:].tolist():
            assert first == left[0]  # the heaviest sample left
            left = left[1:]
            if flat[first] + flat[second] <= level:
                # The heaviest partner that keeps the pair at or below the level.
                heavier = left[: left.index(second)]
                assert all(flat[first] + flat[i] > level for i in heavier)
            else:
                assert second == left[-1]  # none fits: the lightest left
            left.remove(second)
    assert left == []


@SETTINGS
@given(window_shapes(max_count=1, max_slots=8, max_per_slot=8), st.booleans())
def test_engine_with_a_floor_is_never_worse_than_lpt(case, heaviest_only):
    flat, _, num_slots, floor = case
    sorted_costs = flat[sort_order(flat)]
    members = plan_members(sorted_costs, num_slots, floor=floor, heaviest_only=heaviest_only)
    assert sorted(members.reshape(-1).tolist()) == list(range(flat.size))
    assert members.shape == (num_slots, flat.size // num_slots)
    assert score(loads_of(sorted_costs, members)) <= score(loads_of(sorted_costs, lpt_members(sorted_costs, num_slots)))


@SETTINGS
@given(window_shapes(max_count=1, max_slots=8, max_per_slot=8))
def test_heaviest_only_refinement_never_raises_the_heaviest_slot(case):
    flat, _, num_slots, target = case
    sorted_costs = np.sort(flat)[::-1].copy()
    start = lpt_members(sorted_costs, num_slots)
    refined = refine_members(sorted_costs, start, target=target, heaviest_only=True)
    assert sorted(refined.reshape(-1).tolist()) == list(range(flat.size))
    assert loads_of(sorted_costs, refined).max() <= loads_of(sorted_costs, start).max()


def test_large_window_with_a_floor_keeps_heavy_samples_one_per_slot():
    # 8 micro-batches of 512 samples over 64 slots (no search runs at this size): 256 samples of 100, the
    # rest of 1, spread evenly over the window; every forward costs at least 60. A micro-batch holding
    # any heavy sample costs at least 100 + 7 (one heavy and seven light samples in a slot), so at least
    # four do, and the other four cost the floor: 4 * 107 + 4 * 60 = 668 is optimal. Sorted runs put all
    # 256 heavy samples in one micro-batch (4 per slot: 404 + 7 * 60 = 824); balancing each micro-batch
    # where it stands leaves 32 heavy samples in each (8 * 107 = 856).
    rows = [[100 if j % 16 == 0 else 1 for j in range(512)] for _ in range(8)]
    plan = balance_window(rows, 64, across_microbatches=True, floor=60)
    flat = [c for row in rows for c in row]
    tops = [max(sum(flat[i] for i in slot) for slot in slots) for slots in plan]
    assert sum(max(60, top) for top in tops) == 668
    assert sorted(tops) == [8] * 4 + [107] * 4
    # Without a floor, sorted runs are right: the critical path meets the window lower bound.
    assert critical_path(rows, balance_window(rows, 64, across_microbatches=True)) == window_lower_bound(rows, 64)


def test_two_samples_per_slot_pack_each_microbatch_up_to_its_top():
    # Heavy samples of 1000, 990, .. paired: sorted runs pair each run's heaviest with its lightest, so
    # every micro-batch's top pair is two heavy samples; filling to the level pairs each heavy sample
    # with a light one where the heaviest sample sets the top anyway.
    rng = np.random.default_rng(4)
    rows = (rng.pareto(1.5, size=(8, 32)) * 100).astype(np.int64).tolist()
    flat = np.asarray(rows).reshape(-1)
    order = sort_order(flat)
    pairs = pairs_to_level(flat, order, 8, 16, 0)
    runs = [order[m * 32 : (m + 1) * 32] for m in range(8)]
    runs_path = sum(
        int(max(flat[run[i]] + flat[run[31 - i]] for i in range(16))) for run in runs
    )  # the best pairing inside each run: heaviest with lightest
    assert _floored(np.stack([flat[p].sum(axis=1) for p in pairs]), 0) < runs_path
    planned = critical_path(rows, balance_window(rows, 16, across_microbatches=True))
    assert planned <= _floored(np.stack([flat[p].sum(axis=1) for p in pairs]), 0)


def _floored_path(costs, plan, floor):
    flat = [c for row in costs for c in row]
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)


def test_a_window_too_large_to_search_gets_fill_to_level_when_its_bound_cannot_certify_it():
    # 8 x 512 samples over 64 slots (above ``search_max_samples``): heavy-tailed images, 40% text-only, a floor.
    # The swap search skips such windows; where the path bound leaves more than 3% room, fill to level is
    # tried, and keeps the plan valid and never worse (on these windows 2-5% lower).
    from mimo_pipes.balance.quality import window_path_bound

    for seed in range(2):
        rng = np.random.default_rng(seed)
        costs = []
        for _ in range(8):
            row = (rng.pareto(1.2, 512) * 300).astype(np.int64)
            row[rng.random(512) < 0.4] = 0
            costs.append(np.minimum(row, 16384).tolist())
        floor = int(sum(map(sum, costs)) / (8 * 64) * 0.8)
        plan = balance_window(costs, 64, True, floor=floor)
        assert sorted(i for slots in plan for slot in slots for i in slot) == list(range(8 * 512))
        assert all(len(slots) == 64 and all(len(slot) == 8 for slot in slots) for slots in plan)
        without = balance_window(costs, 64, True, floor=floor, tuning=replace(TUNING, certify_max_samples=0))
        path, before = _floored_path(costs, plan, floor), _floored_path(costs, without, floor)
        flat = np.sort(np.asarray([c for row in costs for c in row], dtype=np.int64))[::-1]
        bound = window_path_bound(flat, 8, 64, floor)
        assert (before - bound) * TUNING.certify_gap > bound  # the case the extra start is for
        assert bound <= path < before
