"""The exact search over counts (``count_search``) for windows of few distinct costs: its optimum against every
split of tiny windows and against the search over samples, its plans, its budget, and the planner with it
never worse than without it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from balance_oracles import every_path, path_of_bins
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_window
from mimo_pipes.balance.search.count_search import bin_types, count_types, search_counts
from mimo_pipes.balance.search.window_search import search_window
from mimo_pipes.balance.window.tuning import TUNING

SETTINGS = settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
VALUES = (0, 1, 3, 64, 256, 576, 1024, 1600, 4096)




@st.composite
def few_costs(draw, most: int):
    """(costs sorted heaviest first, W, G, floor): W 1-5, G 1-8, k 1-4, at most ``most`` samples, 1-4 distinct
    costs (zeros among them often), a floor or none."""
    count, num_slots, per_bin = draw(st.integers(1, 5)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    while count * num_slots * per_bin > most:
        if num_slots > 1:
            num_slots -= 1
        elif per_bin > 1:
            per_bin -= 1
        else:
            count -= 1
    values = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=4, unique=True))
    size = count * num_slots * per_bin
    costs = sorted(draw(st.lists(st.sampled_from(values), min_size=size, max_size=size)), reverse=True)
    mean = sum(costs) // (count * num_slots)
    floor = draw(st.sampled_from([0, 0, mean // 2, mean, mean * 2, 1]))
    return costs, count, num_slots, floor


@SETTINGS
@given(few_costs(most=12))
def test_count_search_finds_and_proves_the_optimum_of_every_split(case):
    costs, count, num_slots, floor = case
    optimum = every_path(costs, count, num_slots, floor)
    result = search_counts(costs, count, num_slots, floor, sum(costs) + floor * count + 1, 0, 10**9)
    assert result.proven and result.best == optimum
    assert path_of_bins(costs, result.bins, count, num_slots, floor) == optimum
    # Told the optimum, it finds nothing better, and says so.
    again = search_counts(costs, count, num_slots, floor, optimum, 0, 10**9)
    assert again.bins is None and again.proven and again.best == optimum


@SETTINGS
@given(few_costs(most=24))
def test_count_search_agrees_with_the_search_over_samples(case):
    costs, count, num_slots, floor = case
    incumbent = sum(costs) + floor * count + 1
    reference = search_window(costs, count, num_slots, floor, incumbent, 0, 10**6)
    result = search_counts(costs, count, num_slots, floor, incumbent, 0, 10**9)
    assert result.proven
    if reference.proven:
        assert result.best == reference.best
    else:
        assert result.best <= reference.best
    assert path_of_bins(costs, result.bins, count, num_slots, floor) == result.best


def test_budget_is_a_count_and_the_best_plan_reached_comes_back():
    rng = np.random.default_rng(5)
    costs = sorted(np.where(rng.random(48) < 0.3, 0, rng.choice((576, 1024, 1600), 48)).tolist(), reverse=True)
    full = search_counts(costs, 4, 4, 0, sum(costs) + 1, 0, 10**9)
    assert full.proven
    short = search_counts(costs, 4, 4, 0, sum(costs) + 1, 0, 2_000)
    assert not short.proven and short.nodes <= 2_000
    assert short == search_counts(costs, 4, 4, 0, sum(costs) + 1, 0, 2_000)  # the same on every run
    if short.bins is not None:  # a plan reached before the budget ran out
        assert path_of_bins(costs, short.bins, 4, 4, 0) == short.best >= full.best
    # Nothing to search at the lower bound.
    assert search_counts(costs, 4, 4, 0, 1000, 1000, 10) == (None, 1000, True, 0)


def test_bin_types_are_every_multiset_heaviest_first():
    values = [1024, 576, 0]
    types = bin_types(values, 2)
    assert len(types) == count_types(3, 2) == 6
    assert [load for load, _ in types] == [2048, 1600, 1152, 1024, 576, 0]
    assert all(sum(counts) == 2 for _, counts in types)
    assert count_types(8, 4) == 330 and count_types(1, 5) == 1


def _plan_path(rows: list[list[int]], num_slots: int, floor: int, tuning=TUNING) -> int:
    plan = balance_window(rows, num_slots, across_microbatches=True, floor=floor, tuning=tuning)
    flat = [c for row in rows for c in row]
    size = len(rows[0])
    assert sorted(i for slots in plan for slot in slots for i in slot) == list(range(len(flat)))
    assert all(len(slots) == num_slots and all(len(slot) == size // num_slots for slot in slots) for slots in plan)
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])  # two plans of up to 64 samples each
@given(few_costs(most=64), st.randoms(use_true_random=False))
def test_planner_is_never_worse_with_the_count_search(case, shuffle):
    costs, count, num_slots, floor = case
    shuffle.shuffle(costs)  # the planner sorts
    rows = np.asarray(costs).reshape(count, -1).tolist()
    with_count = _plan_path(rows, num_slots, floor)
    without = _plan_path(rows, num_slots, floor, replace(TUNING, count_work=0))  # the planner before the count search
    assert with_count <= without
