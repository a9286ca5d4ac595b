"""Pairs (and triples) of micro-batches re-planned together: a local search over a window's compositions.

The planner's searches across micro-batches move one sample at a time (swaps) or search the whole
window (branch and bounds up to 64 samples). A mixed window (many text-only samples, which cost 0, and
images of many different costs) can be stuck between the two: a better plan needs several samples to
change micro-batch at once, and the window is too large for the whole search to finish. Two micro-batches
at a time are small enough: their 2B samples are pooled and ``window_search`` (the branch and bound over
samples, with zero costs as free fillers) looks for a plan of the two whose sum of tops is lower, from
their current sum as incumbent, stopping at ``window_path_bound`` of the pool. A pair that gains replaces
its two micro-batches and the sweep starts again, heaviest pairs first; when no pair gains, triples are
searched the same way. The search ends when a sweep gains nothing or the budget (samples placed, a count)
is spent, so the plan is the same on every machine.
Every change lowers the critical path, so the result is never worse than its start.
"""

from __future__ import annotations

import itertools

import numpy as np

from mimo_pipes.balance.canonical import sort_order
from mimo_pipes.balance.quality import window_path_bound
from mimo_pipes.balance.search.window_search import search_window
from mimo_pipes.balance.window.tuning import TUNING, WindowTuning


def _top(flat: np.ndarray, plan: np.ndarray, floor: int) -> int:
    return max(floor, int(flat[plan].sum(axis=1).max()))


def _replan(
    flat: np.ndarray, group: list[np.ndarray], num_slots: int, floor: int, nodes: int
) -> tuple[list[np.ndarray] | None, int]:
    """A better plan of a few micro-batches ((G, k) flat indices each), or None; and the samples placed."""
    pool = np.concatenate([plan.reshape(-1) for plan in group])
    pool = pool[sort_order(flat[pool])]
    incumbent = sum(_top(flat, plan, floor) for plan in group)
    lower = window_path_bound(flat[pool], len(group), num_slots, floor)
    if incumbent <= lower:
        return None, 0
    found = search_window(flat[pool].tolist(), len(group), num_slots, floor, incumbent, lower, nodes)
    if found.bins is None:
        return None, found.nodes
    members = pool[np.argsort(np.asarray(found.bins, dtype=np.int64), kind="stable")]
    return list(members.reshape(len(group), num_slots, -1)), found.nodes


def _sweep(
    flat: np.ndarray, plans: list[np.ndarray], num_slots: int, floor: int, width: int, budget: int, tried: set,
    pair_nodes: int,
) -> tuple[bool, int]:
    """One sweep over the groups of ``width`` micro-batches, heaviest tops first (ties by position): the
    first group that gains replaces its micro-batches in ``plans``. Returns (gained, samples placed)."""
    tops = [_top(flat, plan, floor) for plan in plans]
    ranked = sorted(range(len(plans)), key=lambda m: (-tops[m], m))
    spent = 0
    for group in itertools.combinations(ranked, width):
        key = tuple(np.sort(plans[m].reshape(-1)).tobytes() for m in group)
        if key in tried:
            continue
        nodes = min(pair_nodes * (width - 1), budget - spent)
        if nodes <= 0:
            break
        better, used = _replan(flat, [plans[m] for m in group], num_slots, floor, nodes)
        spent += used
        if better is not None:
            for m, plan in zip(group, better):
                plans[m] = plan
            return True, spent
        tried.add(key)
    return False, spent


def improve_pairs(
    flat: np.ndarray,
    plans: list[np.ndarray],
    num_slots: int,
    floor: int,
    tried: set[tuple[bytes, ...]] | None = None,
    tuning: WindowTuning = TUNING,
) -> list[np.ndarray]:
    """``plans`` (per micro-batch (G, k) flat indices) after re-planning pairs of micro-batches while one
    gains, then (when no pair does) triples (up to ``tuning.pairs_max_width`` micro-batches), back to pairs
    after a triple gains: groups in order of their tops (heaviest first, ties by position), a pair searched
    on ``tuning.pair_nodes`` samples placed (a triple on twice that), all on ``tuning.pairs_start_nodes``.
    ``tried`` holds the groups (by their samples) searched without a gain, which are not searched again
    (only looked up, never iterated: the result does not depend on its order)."""
    plans = [np.asarray(plan, dtype=np.int64) for plan in plans]
    if len(plans) < 2 or plans[0].shape[1] < 2:
        return plans
    tried = set() if tried is None else tried
    widths = range(2, min(len(plans), tuning.pairs_max_width) + 1)
    budget = tuning.pairs_start_nodes
    spent = 0
    while spent < budget:
        for width in widths:
            gained, used = _sweep(flat, plans, num_slots, floor, width, budget - spent, tried, tuning.pair_nodes)
            spent += used
            if gained:
                break
        else:
            break
    return plans


def pairs_replanned(
    flat: np.ndarray,
    order: np.ndarray,
    plans: list[np.ndarray],
    path: int,
    num_slots: int,
    floor: int,
    starts: list[list[np.ndarray]] = (),
    tuning: WindowTuning = TUNING,
) -> tuple[list[np.ndarray], int]:
    """The planner's step between its starts and its exact searches: the plan (per micro-batch (G, k)
    flat indices) and its critical path after :func:`improve_pairs` from ``plans`` and from each of
    ``starts`` (the planner's other starts: pair searches from different plans end in different local
    optima), each on ``tuning.pairs_start_nodes``, for windows of at most ``tuning.pairs_max_samples`` samples
    (two or more per slot) whose plan is more than 1/``tuning.pairs_near_bound`` above the path bound. The lowest path wins, ``plans`` on ties."""
    count = len(plans)
    size = flat.shape[0]
    if count < 2 or size > tuning.pairs_max_samples or size < 2 * count * num_slots:
        return plans, path
    lower = window_path_bound(flat[order], count, num_slots, floor)
    tried: set[tuple[bytes, bytes]] = set()
    for start in [plans, *starts][: tuning.pairs_starts]:
        if (path - lower) * tuning.pairs_near_bound <= lower:
            break
        improved = improve_pairs(flat, start, num_slots, floor, tried, tuning)
        value = sum(_top(flat, plan, floor) for plan in improved)
        if value < path:
            plans, path = improved, value
    return plans, path
