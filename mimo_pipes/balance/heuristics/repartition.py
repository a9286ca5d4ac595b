"""Exact re-partition of a few slots at a time (a large-neighbourhood search).

The heaviest slot and two other slots pool their 3k samples, and the exact search (``exact``) looks for
a split of that pool into three slots of k whose heaviest is below the current heaviest load. Partner
pairs are tried lightest first: (1st, 2nd lightest), (1st, 3rd), (2nd, 3rd), (1st, 4th), ... A success
replaces the three rows, is followed by swap refinement, and the search starts over from the new
heaviest slot. A move is kept only if it does not worsen (heaviest, spread) for the whole micro-batch;
since the three rows end below the old heaviest load, each kept move lowers either the heaviest load
or the number of slots at it, so the search ends. All work is bounded by a total count of search
nodes, so it is deterministic. ``repartition_search`` also reports where a search that ran out of
nodes stopped, so that the caller can continue it with a further budget.
"""

from __future__ import annotations

import numpy as np

from mimo_pipes.balance.canonical import loads_of, score
from mimo_pipes.balance.heuristics.refine import refine_members
from mimo_pipes.balance.search.exact import search_slots

GROUP = 3
NODES_PER_TRY = 400
# Each try is charged this many nodes on top of its search, for its fixed costs (pooling, bound).
TRY_COST = 8


def _partner_pairs(light: list[int]):
    """Pairs of positions in ``light`` (lightest first), ordered by the heavier partner's position."""
    for second in range(1, len(light)):
        for first in range(second):
            yield light[first], light[second]


def _pooled_bound(costs: list[int], per_slot: int) -> int:
    """Average and pigeonhole bounds (see ``quality``) for three slots, on a sorted list."""
    size = len(costs)
    best = -(-sum(costs) // GROUP)
    for t in range(per_slot):
        top = t * GROUP
        rest = per_slot - t - 1
        bound = sum(costs[top - t : top + 1]) + (sum(costs[size - rest :]) if rest else 0)
        best = max(best, bound)
    return best


def repartition_search(
    sorted_costs: np.ndarray,
    members: np.ndarray,
    target: int,
    node_budget: int,
    nodes_per_try: int = NODES_PER_TRY,
    resume: int = 0,
) -> tuple[np.ndarray, int | None]:
    """Improve ``members`` by exact three-slot re-partitions: returns (members, resume position).

    The position is None when the search ended on its own (the target was reached, or no partner
    pair of the heaviest slot gave an improvement): more nodes would only repeat the same tries.
    Otherwise the node budget ran out in the middle of a pass over the partner pairs, and calling
    again on the returned members with ``resume`` set to the position continues that pass where it
    stopped (the pair that used the last nodes is tried again, in full) instead of starting over.
    """
    num_slots, per_slot = members.shape
    if num_slots < GROUP or per_slot < 2 or node_budget <= 0:
        return members, None
    budget = node_budget
    cost_of = sorted_costs.tolist()
    loads = loads_of(sorted_costs, members)
    current = score(loads)
    skip = resume
    while budget > 0 and current[0] > target:
        top = current[0]
        order = np.argsort(loads, kind="stable").tolist()
        heaviest = order[-1]
        load_list = loads.tolist()
        rows_list = members.tolist()
        improved = False
        for position, (a, b) in enumerate(_partner_pairs(order[:-1])):
            if position < skip:
                continue
            if budget <= 0:
                return members, max(position - 1, 0)
            budget -= TRY_COST
            if -(-(top + load_list[a] + load_list[b]) // GROUP) >= top:
                continue
            ranks = sorted(rows_list[heaviest] + rows_list[a] + rows_list[b])
            pooled = [cost_of[r] for r in ranks]
            lower = max(target, _pooled_bound(pooled, per_slot))
            if lower >= top:
                continue
            found, _, _, used = search_slots(pooled, GROUP, top, lower, min(nodes_per_try, budget))
            budget -= used
            if found is None:
                continue
            new_rows: list[list[int]] = [[], [], []]
            for rank, slot in zip(ranks, found):
                new_rows[slot].append(rank)
            trial = members.copy()
            trial[[heaviest, a, b]] = np.asarray(new_rows, dtype=np.int64)
            trial = refine_members(sorted_costs, trial, target=target)
            trial_loads = loads_of(sorted_costs, trial)
            if score(trial_loads) <= current:
                members, loads, current = trial, trial_loads, score(trial_loads)
                improved = True
                break
        if not improved:
            return members, None
        skip = 0
    # Left the loop after an improvement: at the target, or out of nodes before the next pass.
    return members, (0 if current[0] > target else None)
