"""Best-fit decreasing against a target load, with the equal-count constraint.

Samples are taken heaviest first. Each goes to the fullest slot that can still take it without passing
the target ``limit``, counting the room its remaining places will need (each at least as heavy as the
lightest samples); if no slot qualifies, to the lightest slot with room (ties by slot number).

Unlike LPT, which always feeds the lightest slot, this leaves a slot holding one very heavy sample
alone while the target is within reach, and packs the others up to the target. Used as a second start
for refinement when the first result stays well above the lower bound (MULTIFIT-style: the target is
set between the bound and the result).
"""

from __future__ import annotations

import bisect

import numpy as np


def best_fit_members(sorted_costs: np.ndarray, num_slots: int, limit: int) -> np.ndarray:
    """Best-fit decreasing on costs sorted heaviest first; returns the (G, B/G) rank matrix."""
    size = int(sorted_costs.shape[0])
    per_slot = size // num_slots
    if per_slot == 0:
        return np.empty((num_slots, 0), dtype=np.int64)
    costs = sorted_costs.tolist()
    # tails[r]: sum of the r lightest costs.
    tails = [0]
    for cost in reversed(costs):
        tails.append(tails[-1] + cost)
    fill = [0] * num_slots
    slot_of = [0] * size
    open_slots = [(0, slot) for slot in range(num_slots)]  # sorted by (load, slot)
    for rank, cost in enumerate(costs):
        # Fullest slot whose load leaves room for this sample under the limit ...
        position = bisect.bisect_right(open_slots, (limit - cost, num_slots)) - 1
        while position >= 0:
            load, slot = open_slots[position]
            # ... and for its remaining places, each at least one of the lightest samples.
            if load + cost + tails[per_slot - fill[slot] - 1] <= limit:
                break
            position -= 1
        if position < 0:
            position = 0  # nothing fits: the lightest slot with room
        load, slot = open_slots.pop(position)
        slot_of[rank] = slot
        fill[slot] += 1
        if fill[slot] < per_slot:
            bisect.insort(open_slots, (load + cost, slot))
    # Ranks were placed in ascending order: a stable sort by slot lists each slot's ranks in order.
    return np.argsort(np.asarray(slot_of, dtype=np.int64), kind="stable").reshape(num_slots, per_slot)
