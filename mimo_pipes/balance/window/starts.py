"""Starts of the window planner: plans it compares and improves (each micro-batch balanced where it stands,
a composition balanced row by row, heads then fill, fill to level, pairs filled to a level)."""

from __future__ import annotations

import bisect

import numpy as np

from mimo_pipes.balance.canonical import loads_of, sort_order
from mimo_pipes.balance.heuristics.lpt import lpt_members
from mimo_pipes.balance.microbatch import plan_indices, plan_members


def independent(window: np.ndarray, num_slots: int, anchor: bool, floor: int = 0) -> tuple[list[np.ndarray], int]:
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
            indices = plan_indices(window[m], num_slots, floor=floor)
        if indices.size:
            path += int(loads_of(window[m], indices).max())
        plans.append(indices + m * size)
    return plans, path



def balanced(
    flat: np.ndarray, rows: np.ndarray, num_slots: int, floor: int, exact: bool = False, heaviest_only: bool = False
) -> list[np.ndarray]:
    """Each row (flat indices in sorted order) balanced by the engine (``heaviest_only``: for its heaviest
    slot alone, since the spread of a micro-batch does not change the critical path): per-micro-batch
    (G, k) flat indices."""
    return [
        row[plan_members(flat[row], num_slots, exact=exact, floor=floor, heaviest_only=heaviest_only)] for row in rows
    ]



def fill_to_level(window: np.ndarray, num_slots: int, floor: int, opened: int | None = None) -> list[np.ndarray]:
    """Heads then fill: the W*G heaviest samples open one slot each (sorted runs of G make the
    micro-batches); every other sample, heaviest first, goes where it raises the critical path least,
    and among those into the slot it leaves with the least room below its micro-batch's top (best fit),
    ties to the lower slot. Pairs a heavy head with light samples where the head sets the top anyway.

    With ``opened`` 1, *fill to level*: only the heaviest micro-batch starts with heads, and a slot keeps
    room under the level for its remaining places (each at least one of the lightest samples); samples
    go where they raise the path least, and among those into the slot with the most room (worst fit), so
    the heaviest micro-batch takes all it can hold under its top, spread over its slots, before the next
    micro-batch opens; a very heavy sample's micro-batch then absorbs the heavy samples that would each
    lift another micro-batch above the floor."""
    count, size = window.shape
    flat = window.reshape(-1)
    order = sort_order(flat)
    bins = count * num_slots
    per_bin = size // num_slots
    heads = bins if opened is None else opened * num_slots
    members = np.empty((bins, per_bin), dtype=np.int64)
    members[:heads, 0] = order[:heads]
    loads = np.zeros(bins, dtype=np.int64)
    loads[:heads] = flat[order[:heads]]
    fill = np.zeros(bins, dtype=np.int64)
    fill[:heads] = 1
    group = np.arange(bins) // num_slots
    tops = np.maximum(loads[::num_slots], floor)  # heads are sorted: the first of each run is the top
    big = np.iinfo(np.int64).max // 4
    # Filling to level (one micro-batch opened): room kept for each slot's remaining places.
    lightest = np.concatenate(([0], np.cumsum(flat[order[::-1]])))[:per_bin] if opened is not None else None
    for index in order[heads:].tolist():
        cost = int(flat[index])
        new = loads + cost
        level = tops[group]
        if lightest is not None:
            level = level - lightest[np.maximum(per_bin - fill - 1, 0)]
        rise = np.where(fill < per_bin, np.maximum(new - level, 0), big)
        room = np.where(rise == 0, level - new, 0)
        fits = np.flatnonzero(rise == rise.min())
        slot = int(fits[np.argmin(room[fits])]) if lightest is None else int(fits[np.argmax(room[fits])])
        members[slot, fill[slot]] = index
        fill[slot] += 1
        loads[slot] = new[slot]
        tops[group[slot]] = max(tops[group[slot]], int(new[slot]))
    return [members[m * num_slots : (m + 1) * num_slots] for m in range(count)]



def pairs_to_level(flat: np.ndarray, order: np.ndarray, count: int, num_slots: int, floor: int) -> list[np.ndarray]:
    """Two samples per slot: micro-batch by micro-batch, heaviest first. The heaviest sample left and the
    lightest left open the micro-batch and set its level (at least the floor); each of its other G-1 slots
    takes the heaviest sample left and, as partner, the heaviest sample left that keeps the pair at or
    below the level (the lightest left if none does). A micro-batch thus packs as much weight as its top
    pair allows, instead of the next 2G samples of the sorted order."""
    costs = flat[order].tolist()  # by rank: heaviest first
    left = list(range(len(costs)))  # ranks not placed yet, ascending (heaviest first)
    plans = []
    for _ in range(count):
        heaviest = left.pop(0)
        lightest = left.pop()
        level = max(floor, costs[heaviest] + costs[lightest])
        pairs = [(heaviest, lightest)]
        for _ in range(num_slots - 1):
            rank = left.pop(0)
            # Costs fall along ``left``: the partners that fit are a suffix; take its first.
            position = bisect.bisect_left(left, -(level - costs[rank]), key=lambda r: -costs[r])
            pairs.append((rank, left.pop(min(position, len(left) - 1))))
        plans.append(order[np.asarray(pairs, dtype=np.int64)])
    return plans
