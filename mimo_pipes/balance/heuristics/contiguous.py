"""The naive split: no balancing at all. Slot s gets indices s*B/G .. (s+1)*B/G - 1."""

from __future__ import annotations

from collections.abc import Sequence

from mimo_pipes.balance.validate import check_costs


def contiguous_assignment(costs: Sequence[int], num_slots: int) -> list[list[int]]:
    """Slot s holds the contiguous block of indices [s*B/G, (s+1)*B/G)."""
    array = check_costs(costs, num_slots)
    per_slot = array.shape[0] // num_slots
    return [list(range(s * per_slot, (s + 1) * per_slot)) for s in range(num_slots)]
