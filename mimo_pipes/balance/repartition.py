"""Exact re-partition of a few slots at a time (a large-neighbourhood search).

The heaviest slot and two other slots pool their 3k samples, and the exact search (``exact``) looks for
a split of that pool into three slots of k whose heaviest is below the current heaviest load. Partner
pairs are tried lightest first: (1st, 2nd lightest), (1st, 3rd), (2nd, 3rd), (1st, 4th), ... A success
replaces the three rows, is followed by swap refinement, and the search starts over from the new
heaviest slot. A move is kept only if it does not worsen (heaviest, spread) for the whole micro-batch;
since the three rows end below the old heaviest load, each kept move lowers either the heaviest load
or the number of slots at it, so the search ends. All work is bounded by a total count of search
nodes, so it is deterministic.
"""

from __future__ import annotations

import numpy as np

from mimo_pipes.balance.canonical import loads_of, score
from mimo_pipes.balance.exact import exact_members
from mimo_pipes.balance.quality import sorted_lower_bound
from mimo_pipes.balance.refine import refine_members

GROUP = 3
NODES_PER_TRY = 400
# Each try is charged this many nodes on top of its search, for its fixed costs (pooling, bound).
TRY_COST = 8


def _partner_pairs(light: list[int]):
    """Pairs of positions in ``light`` (lightest first), ordered by the heavier partner's position."""
    for second in range(1, len(light)):
        for first in range(second):
            yield light[first], light[second]


def repartition_members(
    sorted_costs: np.ndarray,
    members: np.ndarray,
    target: int,
    node_budget: int,
    nodes_per_try: int = NODES_PER_TRY,
) -> np.ndarray:
    """Improve ``members`` by exact three-slot re-partitions; returns the (possibly same) matrix."""
    num_slots, per_slot = members.shape
    if num_slots < GROUP or per_slot < 2 or node_budget <= 0:
        return members
    budget = node_budget
    loads = loads_of(sorted_costs, members)
    current = score(loads)
    while budget > 0 and current[0] > target:
        order = np.argsort(loads, kind="stable")
        heaviest = int(order[-1])
        light = [int(s) for s in order[:-1]]
        improved = False
        for a, b in _partner_pairs(light):
            if budget <= 0:
                break
            rows = [heaviest, a, b]
            ranks = np.sort(members[rows].reshape(-1))
            limit = min(nodes_per_try, budget)
            found, used = _solve(sorted_costs[ranks], current[0], target, limit)
            budget -= used + TRY_COST
            if found is None:
                continue
            trial = members.copy()
            trial[rows] = ranks[found]
            trial = refine_members(sorted_costs, trial, target=target)
            trial_loads = loads_of(sorted_costs, trial)
            if score(trial_loads) <= current:
                members, loads, current = trial, trial_loads, score(trial_loads)
                improved = True
                break
        if not improved:
            break
    return members


def _solve(sub_costs: np.ndarray, incumbent: int, target: int, node_limit: int):
    """Exact search on one pooled group (costs sorted heaviest first)."""
    lower = max(target, sorted_lower_bound(sub_costs, GROUP, thorough=False))
    if lower >= incumbent:
        return None, 0
    result = exact_members(sub_costs, GROUP, incumbent=incumbent, lower=lower, node_limit=node_limit)
    return result.members, result.nodes
