"""Windows of W micro-batches: balance each one on its own, or let samples move between them.

Across micro-batches (opt-in), the objective is the vision critical path: the sum over the window's
micro-batches of their heaviest slot. Samples of the whole window are sorted by (-cost, flat index)
and cut into W consecutive runs of B: the heaviest B samples form one micro-batch, the next B the
next, and so on. Every micro-batch then holds samples of similar cost, which can be split evenly, and
each is balanced with the micro-batch engine. With one sample per slot this is optimal (the m-th
micro-batch's heaviest slot can be no lighter than the (mB)-th heaviest sample of the window).
The result is compared with balancing every micro-batch where it stands with equal-count LPT, and
with the window as it stands (contiguous slots, nothing moves); the lowest critical path is kept,
ties going to the window as it stands.

Output order: within a slot, ascending flat indices (m*B + j); slots of a micro-batch ordered by their
smallest index; micro-batches ordered by their smallest index when samples may move, in window order
otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mimo_pipes.balance.canonical import loads_of, sort_order
from mimo_pipes.balance.lpt import lpt_members
from mimo_pipes.balance.microbatch import plan_indices, plan_members
from mimo_pipes.balance.validate import check_window


def _canonical_microbatch(indices: np.ndarray) -> list[list[int]]:
    """(G, k) flat indices -> canonical list of slots."""
    if indices.size == 0:
        return [[] for _ in range(indices.shape[0])]
    rows = np.sort(indices, axis=1)
    return rows[np.argsort(rows[:, 0], kind="stable")].tolist()


def _independent(window: np.ndarray, num_slots: int, anchor: bool) -> tuple[list[np.ndarray], int]:
    """Balance each micro-batch where it stands (with the engine, or with LPT if ``anchor``).
    Returns per-micro-batch (G, k) flat indices and the critical path."""
    count, size = window.shape
    plans = []
    path = 0
    for m in range(count):
        if anchor:
            order = sort_order(window[m])
            indices = order[lpt_members(window[m][order], num_slots)]
        else:
            indices = plan_indices(window[m], num_slots)
        if indices.size:
            path += int(loads_of(window[m], indices).max())
        plans.append(indices + m * size)
    return plans, path


def _across(window: np.ndarray, num_slots: int) -> tuple[list[np.ndarray], int]:
    """Sorted runs of B over the whole window, each balanced. Returns (plans, critical path)."""
    count, size = window.shape
    flat = window.reshape(-1)
    order = sort_order(flat)  # flat indices, heaviest first, ties by index
    sorted_costs = flat[order]
    plans = []
    path = 0
    for m in range(count):
        run = sorted_costs[m * size : (m + 1) * size]
        members = plan_members(run, num_slots, exact=False)
        if members.size:
            path += int(loads_of(run, members).max())
        plans.append(order[members + m * size])
    return plans, path


def balance_window(
    costs: Sequence[Sequence[int]], num_slots: int, across_microbatches: bool = False
) -> list[list[list[int]]]:
    """Balance a window of W micro-batches of B samples each over ``num_slots`` slots.

    Returns, per micro-batch, per slot, indices into the flattened window (m*B + j). Every micro-batch
    keeps B samples and every slot B/G. With ``across_microbatches`` False, micro-batch m holds exactly
    its own samples m*B .. m*B+B-1, balanced as by :func:`balance_microbatch`. With True, samples may
    move between the window's micro-batches to lower the critical path (sum of heaviest slots).
    Raises ValueError on invalid costs, micro-batches of different sizes, an empty window, or a size
    not divisible by ``num_slots``.
    """
    window = check_window(costs, num_slots)
    num_slots = int(num_slots)
    if not across_microbatches:
        plans, _ = _independent(window, num_slots, anchor=False)
        return [_canonical_microbatch(plan) for plan in plans]
    plans, path = _across(window, num_slots)
    anchor, anchor_path = _independent(window, num_slots, anchor=True)
    if anchor_path < path:
        plans, path = anchor, anchor_path
    count, size = window.shape
    if size:
        # Nothing moves if the window as it stands (contiguous slots) is at least as good.
        still = window.reshape(count, num_slots, -1).sum(axis=2).max(axis=1).sum()
        if int(still) <= path:
            per_slot = size // num_slots
            plans = [
                np.arange(m * size, (m + 1) * size, dtype=np.int64).reshape(num_slots, per_slot)
                for m in range(count)
            ]
    result = [_canonical_microbatch(plan) for plan in plans]
    result.sort(key=lambda slots: min((slot[0] for slot in slots if slot), default=0))
    return result
