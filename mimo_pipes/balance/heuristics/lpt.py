"""The published anchor: equal-count greedy LPT (longest processing time first).

Samples are taken in (-cost, index) order; each goes to the lightest slot that still has room,
ties broken by the lower slot index. This is the reference every other engine is measured against,
and :func:`mimo_pipes.balance.balance_microbatch` never returns anything worse than it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from mimo_pipes.balance.canonical import slots_in_canonical_order, sort_order
from mimo_pipes.balance.validate import check_costs


def lpt_members(sorted_costs: np.ndarray, num_slots: int) -> np.ndarray:
    """Equal-count LPT on costs already sorted heaviest first; returns the (G, B/G) rank matrix."""
    size = int(sorted_costs.shape[0])
    per_slot = size // num_slots
    if per_slot == 0:
        return np.empty((num_slots, 0), dtype=np.int64)
    # Heap of load * G + slot: lightest first, ties by the lower slot, one int per entry.
    if num_slots == 1 or sorted_costs[num_slots - 2] > 0:
        # The G heaviest samples open the G slots in order (each goes to the first empty slot).
        first = num_slots
        slot_of = list(range(num_slots))
        fill = [1] * num_slots
        heap = [] if per_slot == 1 else (sorted_costs[:num_slots] * num_slots + np.arange(num_slots)).tolist()
        heapq.heapify(heap)
    else:  # zero costs among them: a slot that took a zero is still the lightest
        first = 0
        slot_of = []
        fill = [0] * num_slots
        heap = list(range(num_slots))
    # The zero costs (sorted last) are placed below, all at once.
    stop = max(first, int(np.count_nonzero(sorted_costs)))
    replace, pop, place = heapq.heapreplace, heapq.heappop, slot_of.append
    for scaled in (sorted_costs[first:stop] * num_slots).tolist():  # ranks first, first + 1, ...: in order
        key = heap[0]
        slot = key % num_slots
        place(slot)
        filled = fill[slot] + 1
        fill[slot] = filled
        if filled < per_slot:
            replace(heap, key + scaled)
        else:
            pop(heap)
    # A zero cost leaves the loads as they are: each goes to the lightest slot with room, which stays the lightest
    # until it is full, so the zeros fill the open slots one after another in heap order.
    for key in sorted(heap):
        slot = key % num_slots
        slot_of += [slot] * (per_slot - fill[slot])
    # Ranks were placed in ascending order, so a stable sort by slot lists each slot's ranks in order.
    return np.argsort(np.asarray(slot_of, dtype=np.int64), kind="stable").reshape(num_slots, per_slot)


def lpt_assignment(costs: Sequence[int], num_slots: int) -> list[list[int]]:
    """Equal-count greedy LPT: G lists of indices, canonical order (see ``canonical``)."""
    array = check_costs(costs, num_slots)
    order = sort_order(array)
    return slots_in_canonical_order(lpt_members(array[order], num_slots), order)
