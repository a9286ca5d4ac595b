"""The window planner's exact searches: which ones a window gets, on what budgets, from the best plan so far
(``count_search`` for few distinct costs, then ``bin_search`` and ``window_search`` for small windows)."""

from __future__ import annotations

import numpy as np

from mimo_pipes.balance.quality import window_path_bound
from mimo_pipes.balance.search.bin_search import search_bins
from mimo_pipes.balance.search.count_search import count_types, search_counts
from mimo_pipes.balance.search.window_search import WindowSearch, search_window
from mimo_pipes.balance.window.tuning import WindowTuning


def branch_and_bound(
    values: list[int], count: int, num_slots: int, floor: int, result: WindowSearch, lower: int, tuning: WindowTuning
) -> WindowSearch:
    """The searches over samples, from ``result`` (the best plan so far: its ``bins``, or None for the
    planner's own, and its path).

    With many equal costs (at most half as many distinct costs as samples: text-only zeros, images of a few
    resolutions), first over bins alone (no micro-batch labels: equal costs and equal bins are tried once,
    whatever micro-batch they would sit in), on a budget of its own; then, unless that proved its result, the
    labelled search (its per-micro-batch room bound cuts more where costs differ) from the best plan so far,
    on the whole budget, so a window with ties is never searched less than one without. Each starts from the
    best plan before it, so a better start never ends worse (its search visits a part of the same tree, in
    the same order)."""
    distinct = len(set(values))
    if distinct * tuning.ties <= len(values):
        # A few distinct costs leave few distinct plans, each of which the search over bins tries once: a
        # larger budget there reaches the optimum that the labelled search (which tries every labelling) cannot.
        budget = tuning.exact_nodes * tuning.few_costs_factor if distinct <= tuning.few_costs else tuning.exact_nodes
        binned = search_bins(values, count, num_slots, floor, result.best, lower, budget)
        if binned.bins is not None or binned.proven:
            result = WindowSearch(binned.bins or result.bins, binned.best, binned.proven, binned.nodes)
    if not result.proven:
        labelled = search_window(values, count, num_slots, floor, result.best, lower, tuning.exact_nodes)
        if labelled.bins is not None:
            result = labelled
    return result


def searched(
    window: np.ndarray,
    order: np.ndarray,
    plans: list[np.ndarray],
    path: int,
    num_slots: int,
    floor: int,
    tuning: WindowTuning,
) -> tuple[list[np.ndarray], int, bool]:
    """The plan, its critical path and whether it is proved optimal, after the exact searches that try to
    beat ``path``: over counts
    (windows of a few distinct costs, up to ``count_max_samples`` samples), then, unless that proved its plan
    optimal, over samples (up to ``exact_max_samples``). They stop early at a lower bound of the window, so a
    plan on it is not searched at all."""
    count, size = window.shape
    flat = window.reshape(-1)
    costs = flat[order]
    values = costs.tolist()
    distinct = len(set(values))
    # A few distinct costs: an exact search over counts of each cost (bins as types, plans as multisets of
    # them), on a budget of its own; its answer is optimal when it finishes.
    counted = (
        len(values) <= tuning.count_max_samples
        and distinct <= tuning.few_costs
        and count_types(distinct, size // num_slots) <= tuning.count_max_types
    )
    if not counted and len(values) > tuning.exact_max_samples:
        return plans, path, False
    lower = window_path_bound(costs, count, num_slots, floor)
    if (path - lower) * tuning.near_bound <= lower:
        return plans, path, path <= lower  # within 0.1% of the bound: the search cannot gain enough to pay for itself
    result = WindowSearch(None, path, False, 0)
    if counted:
        result = search_counts(values, count, num_slots, floor, path, lower, tuning.count_work)
    if not result.proven and len(values) <= tuning.exact_max_samples:
        result = branch_and_bound(values, count, num_slots, floor, result, lower, tuning)
    if result.bins is None:
        return plans, path, result.proven
    bins = np.asarray(result.bins, dtype=np.int64)
    # Samples in sorted order, grouped by bin (a stable sort keeps each bin's samples in rank order).
    members = order[np.argsort(bins, kind="stable")].reshape(count, num_slots, -1)
    return list(members), result.best, result.proven
