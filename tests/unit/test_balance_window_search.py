"""The branch and bound that ends the planning of small windows (``window_search``), the path bound it
stops at, and what the window planner makes of them; the LPT anchor against a plain heap."""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np
from balance_oracles import every_path, path_of_bins
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_window, critical_path
from mimo_pipes.balance.heuristics.lpt import lpt_members
from mimo_pipes.balance.quality import heads_and_rest_bound, window_lower_bound, window_path_bound
from mimo_pipes.balance.search.window_search import search_window
from mimo_pipes.balance.window.tuning import TUNING

SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def small_windows(draw):
    """(costs sorted heaviest first, W, G, floor): at most 12 samples, with ties, zeros and heavy tails."""
    shape = draw(st.sampled_from([(2, 1, 2), (2, 2, 2), (3, 2, 2), (2, 3, 2), (2, 2, 3), (3, 1, 4), (4, 1, 3), (2, 1, 6)]))
    count, num_slots, per_bin = shape
    size = count * num_slots * per_bin
    values = st.one_of(st.just(0), st.integers(0, 20), st.integers(0, 5000))
    costs = sorted(draw(st.lists(values, min_size=size, max_size=size)), reverse=True)
    floor = draw(st.one_of(st.just(0), st.integers(0, 8000)))
    return costs, count, num_slots, floor


@st.composite
def heavy_windows(draw):
    """(costs sorted heaviest first, W, G, floor): a few huge costs among light ones and zeros, more of them than
    slots at times, so that the bounds' heads and stacks are what binds."""
    count, num_slots, per_bin = draw(st.sampled_from([(3, 2, 1), (4, 2, 1), (3, 3, 1), (4, 1, 2), (2, 2, 2), (2, 3, 1)]))
    size = count * num_slots * per_bin
    values = st.one_of(st.just(0), st.integers(0, 30), st.sampled_from([1000, 1000, 997]), st.integers(0, 3000))
    costs = sorted(draw(st.lists(values, min_size=size, max_size=size)), reverse=True)
    floor = draw(st.one_of(st.just(0), st.just(0), st.integers(0, 2500)))
    return costs, count, num_slots, floor



@SETTINGS
@given(small_windows())
def test_search_finds_and_proves_the_optimum(case):
    costs, count, num_slots, floor = case
    optimum = every_path(costs, count, num_slots, floor)
    result = search_window(costs, count, num_slots, floor, sum(costs) + floor * count + 1, 0, 10**6)
    assert result.proven and result.best == optimum
    per_bin = len(costs) // (count * num_slots)
    assert sorted(result.bins) == sorted(b for b in range(count * num_slots) for _ in range(per_bin))
    assert path_of_bins(costs, result.bins, count, num_slots, floor) == optimum
    # Told the optimum, it finds nothing better, and says so.
    again = search_window(costs, count, num_slots, floor, optimum, 0, 10**6)
    assert again.bins is None and again.proven and again.best == optimum


@SETTINGS
@given(st.one_of(small_windows(), heavy_windows()))
def test_path_bound_never_exceeds_the_optimum(case):
    """Every bound family (average, largest samples, heads and the rest, stacked heavy samples, the lighter
    slots) against every split tried, with and without a floor. (Plans never below the bounds:
    test_balance.py, test_balance_window_mixed.py.)"""
    costs, count, num_slots, floor = case
    heaviest_first = np.sort(np.asarray(costs, dtype=np.int64))[::-1]
    bound, optimum = window_path_bound(heaviest_first, count, num_slots, floor), every_path(costs, count, num_slots, floor)
    assert heads_and_rest_bound(heaviest_first, count, num_slots, floor) <= bound <= optimum
    size = len(costs) // count
    rows = [costs[m * size : (m + 1) * size] for m in range(count)]
    assert window_lower_bound(rows, num_slots) <= (every_path(costs, count, num_slots, 0) if floor else optimum)


def test_the_bound_counts_stacked_and_lone_heavy_samples():
    """Two shapes where the average and the largest samples alone were far below the optimum, now met: 3 huge
    samples over 2 slots stack two in one slot (or take two micro-batches); one huge sample leaves the rest
    of the window to be shared at its mean."""
    stacked = [[1000, 1000, 0, 0], [1000, 0, 0, 0], [0, 0, 0, 0]]  # W 3, B 4, G 2: k 2
    assert window_lower_bound(stacked, 2) == every_path(sorted(sum(stacked, []), reverse=True), 3, 2, 0) == 2000
    lone = [[900, 10, 10, 10], [10, 10, 10, 10], [10, 10, 10, 10]]  # G 4: the first micro-batch costs 900
    assert window_lower_bound(lone, 4) == 900 + 20 == every_path(sorted(sum(lone, []), reverse=True), 3, 4, 0)


def test_search_stops_at_its_budget_and_at_the_bound():
    rng = np.random.default_rng(3)
    costs = sorted((rng.pareto(1.2, 48) * 300).astype(int).tolist(), reverse=True)
    short = search_window(costs, 4, 4, 0, sum(costs), 0, 50)
    assert not short.proven and short.nodes == 50
    # At the lower bound there is nothing to search.
    assert search_window(costs, 4, 4, 0, 1000, 1000, 50) == (None, 1000, True, 0)


@SETTINGS
@given(small_windows())
def test_planner_reaches_the_optimum_of_small_windows_with_room_to_search(case):
    costs, count, num_slots, floor = case
    per_bin = len(costs) // (count * num_slots)
    rows = np.asarray(costs).reshape(count, -1)[:, ::-1].tolist()  # not sorted: the planner sorts
    tuning = replace(TUNING, exact_nodes=10**6, near_bound=10**12)
    plan = balance_window(rows, num_slots, across_microbatches=True, floor=floor, tuning=tuning)
    assert sorted(i for slots in plan for slot in slots for i in slot) == list(range(len(costs)))
    assert all(len(slot) == per_bin for slots in plan for slot in slots)
    flat = [c for row in rows for c in row]
    path = sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)
    optimum = every_path(costs, count, num_slots, floor)
    assert path == optimum


def test_heavy_tailed_window_within_two_percent_of_its_proven_optimum():
    # Two micro-batches of 12 samples over 4 slots, three a slot: the planner's swaps and starts left
    # this one 3.5% above the optimum (3754 against 3628: the micro-batch with the heaviest samples must
    # take mid-sized ones up to a higher level than any start sets); the search finds 3690 at once.
    rows = [[988, 99, 920, 300, 572, 928, 210, 228, 414, 960, 272, 121],
            [169, 270, 224, 1296, 1935, 650, 2209, 352, 360, 132, 576, 286]]
    costs = sorted(rows[0] + rows[1], reverse=True)
    proof = search_window(costs, 2, 4, 0, sum(costs), window_path_bound(np.asarray(costs), 2, 4), 10**6)
    assert proof.proven
    assert critical_path(rows, balance_window(rows, 4, across_microbatches=True)) <= proof.best * 1.02


def lpt_reference(sorted_costs: list[int], num_slots: int) -> list[list[int]]:
    """Equal-count LPT as published: each sample, heaviest first, to the lightest slot with room."""
    per_slot = len(sorted_costs) // num_slots
    heap = [(0, slot) for slot in range(num_slots)]
    slots: list[list[int]] = [[] for _ in range(num_slots)]
    for rank, cost in enumerate(sorted_costs):
        load, slot = heapq.heappop(heap)
        slots[slot].append(rank)
        if len(slots[slot]) < per_slot:
            heapq.heappush(heap, (load + cost, slot))
    return slots


@settings(deadline=None, max_examples=150)
@given(st.integers(1, 9), st.integers(0, 6), st.data())
def test_lpt_is_the_published_greedy(num_slots, per_slot, data):
    values = st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 10**6))
    costs = sorted(data.draw(st.lists(values, min_size=num_slots * per_slot, max_size=num_slots * per_slot)), reverse=True)
    members = lpt_members(np.asarray(costs, dtype=np.int64), num_slots)
    assert members.reshape(num_slots, per_slot).tolist() == lpt_reference(costs, num_slots)
