"""Balanced (equal-count) Karmarkar-Karp differencing for G slots.

The sorted costs are cut into B/G consecutive groups of G samples; each group is a partial solution
that puts one sample in each of G slots. Repeatedly, the two partial solutions with the largest spread
(heaviest minus lightest slot) are merged by pairing the heaviest slot of one with the lightest slot of
the other, second heaviest with second lightest, and so on. Every merge adds exactly one sample per
slot, so the result has B/G samples in every slot. Ties (equal spreads) go to the partial solution
created first; rows with equal loads keep their previous order (stable sorts), so the result depends on
the sorted costs alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from mimo_pipes.balance.canonical import slots_in_canonical_order, sort_order
from mimo_pipes.balance.validate import check_costs


def kk_members(sorted_costs: np.ndarray, num_slots: int) -> np.ndarray:
    """Balanced KK on costs sorted heaviest first; returns the (G, B/G) rank matrix."""
    size = int(sorted_costs.shape[0])
    per_slot = size // num_slots
    if per_slot == 0:
        return np.empty((num_slots, 0), dtype=np.int64)
    ranks = np.arange(size, dtype=np.int64).reshape(per_slot, num_slots)
    heap = []
    parts = []
    for g in range(per_slot):
        # A group's slots are already heaviest first (costs are sorted).
        loads = sorted_costs[ranks[g]].copy()
        parts.append((loads, ranks[g].reshape(num_slots, 1)))
        heapq.heappush(heap, (-int(loads[0] - loads[-1]), g))
    while len(heap) > 1:
        _, a = heapq.heappop(heap)
        _, b = heapq.heappop(heap)
        loads_a, members_a = parts[a]  # heaviest first
        loads_b, members_b = parts[b]
        # Heaviest of a with lightest of b.
        loads = loads_a + loads_b[::-1]
        members = np.concatenate((members_a, members_b[::-1]), axis=1)
        order = np.argsort(-loads, kind="stable")
        loads, members = loads[order], members[order]
        parts[a] = parts[b] = None  # type: ignore[call-overload]
        parts.append((loads, members))
        heapq.heappush(heap, (-int(loads[0] - loads[-1]), len(parts) - 1))
    _, last = heap[0]
    return parts[last][1]


def karmarkar_karp_assignment(costs: Sequence[int], num_slots: int) -> list[list[int]]:
    """Balanced Karmarkar-Karp differencing alone (no refinement): G lists of indices, canonical order."""
    array = check_costs(costs, num_slots)
    order = sort_order(array)
    return slots_in_canonical_order(kk_members(array[order], num_slots), order)
