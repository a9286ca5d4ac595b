"""A search over the levels of a window's micro-batches: the plan found by choosing its W tops at once.

A plan's critical path is the sum of its W levels (the (mG+1)-th heaviest slot loads, at least the floor:
``level_repair``), so the search picks levels and asks ``repair`` to fill the slots under them. Three
moves, each from the plan it has:

1. Levels one at a time, each as low as the repair reaches (a bisection on the level, the levels not yet
   chosen above it free, those below it capped by it), in two orders: from the top down, and with the top
   level left free and chosen last (a heavy top micro-batch that takes the heaviest pairs and frees the
   others). The lowest z levels (z from 0 to ``levels_max_light``, while the z-th is no heavier than half
   the mean slot load or the floor) are first fixed at what the z*G*k lightest samples reach, G*k at a
   time, dealt heaviest first to the lightest slot: micro-batches of text-only samples (cost 0) or of the
   lightest images, which cost only the floor or little above it.
2. After each, a descent: a level lowered by one, or a trade (a level lowered by half its gap to another
   and that other raised by half of that), the first target the repair reaches taken, until none is.
3. Every plan the repairs pass through counts: the least critical path seen is the result.

Budgets are counts (swaps, candidate swaps looked at), so the plan is the same on every machine; the result
is never worse than the plan it starts from.
"""

from __future__ import annotations

import numpy as np

from mimo_pipes.balance.window.level_repair import Passed, repair, sorted_path
from mimo_pipes.balance.window.tuning import WindowTuning


def _tops(flat: np.ndarray, members: np.ndarray, num_slots: int, floor: int) -> np.ndarray:
    return np.maximum(np.sort(flat[members].sum(axis=1))[::-1][::num_slots], floor)


def _caps(levels: list[int], num_slots: int) -> np.ndarray:
    return np.sort(np.repeat(np.asarray(levels, dtype=np.int64), num_slots))[::-1].copy()


def light_levels(flat: np.ndarray, light: int, num_slots: int, per_slot: int, floor: int) -> list[int]:
    """Levels of the ``light`` lowest micro-batches made of the lightest samples (highest first): each takes the
    next G*k lightest, dealt heaviest first to the lightest slot with room."""
    ordered = np.sort(flat)
    levels = []
    for group in range(light):
        slots = np.zeros(num_slots, dtype=np.int64)
        held = np.zeros(num_slots, dtype=np.int64)
        for cost in ordered[group * num_slots * per_slot : (group + 1) * num_slots * per_slot][::-1]:
            open_slots = np.flatnonzero(held < per_slot)
            slot = open_slots[np.argmin(slots[open_slots])]
            slots[slot] += cost
            held[slot] += 1
        levels.append(max(int(slots.max()), floor))
    return levels[::-1]


def _bisected(
    flat: np.ndarray, members: np.ndarray, count: int, num_slots: int, floor: int, light: int, top_last: bool,
    passed: Passed, tried: dict, tuning: WindowTuning,
) -> np.ndarray | None:
    """Step 1: the levels chosen one at a time (see the module's docstring); the plan that meets them, or None."""
    per_slot = members.shape[1]
    free = int(np.sort(flat)[::-1][:per_slot].sum())  # no slot is heavier
    total = int(flat.sum())
    chosen_count = count - light
    bottom = light_levels(flat, light, num_slots, per_slot, floor)
    skip = 1 if top_last else 0
    levels: list[int | None] = [None] * chosen_count
    for m in [*range(skip, chosen_count), *range(min(skip, chosen_count))]:
        above = [levels[i] for i in range(m) if levels[i] is not None]
        below = [level for level in levels[m + 1 :] if level is not None]
        high = min(above) if above else free
        low = max([floor, *below, *bottom])
        rest = chosen_count - m - len(below)
        if len(above) == m and rest > 0:  # the slots left hold what the fixed levels cannot
            fixed = sum(level for level in levels if level is not None) + sum(bottom)
            low = max(low, -(-(total - num_slots * fixed) // (num_slots * rest)))
        best = None
        while low <= high:
            mid = (low + high) // 2
            target = [level if level is not None else (free if i < m else mid) for i, level in enumerate(levels)]
            target[m] = mid
            caps = _caps(target + bottom, num_slots)
            key = caps.tobytes()
            if key not in tried:
                tried[key] = repair(flat, members, caps, num_slots, floor, passed, tuning)
            if tried[key] is not None:
                best, members, high = mid, tried[key], mid - 1
            else:
                low = mid + 1
            if passed.work >= tuning.levels_work:
                return None
        if best is None:
            return None
        levels[m] = best
    return members


def _targets(tops: np.ndarray, floor: int) -> list[np.ndarray]:
    """Step 2's targets from levels ``tops`` (descending): each distinct level above the floor lowered by one
    (its lowest micro-batch), then for each pair of levels the trades both ways."""
    count = tops.shape[0]
    targets = []
    for m in range(count):
        if tops[m] > floor and (m + 1 == count or tops[m + 1] < tops[m]):
            target = tops.copy()
            target[m] -= 1
            targets.append(target)
    for i in range(count):
        for j in range(i + 1, count):
            gap = int(tops[i]) - int(tops[j])
            if gap <= 2 or tops[i] <= floor:
                continue
            target = tops.copy()
            target[i] -= gap // 2
            target[j] += gap // 4
            targets.append(np.sort(target)[::-1])
            if tops[j] > floor:
                target = tops.copy()
                target[j] = max(int(tops[j]) - gap // 2, floor)
                target[i] += (int(tops[j]) - int(target[j])) // 2
                targets.append(np.sort(target)[::-1])
    return targets


def _descended(
    flat: np.ndarray, members: np.ndarray, num_slots: int, floor: int, passed: Passed, tuning: WindowTuning
) -> None:
    """Step 2 from ``members``: the first target whose repair passes a plan better than the current one moves
    there, until none does or its budget is spent; ``passed`` then keeps the best plan of the two."""
    current = sorted_path(flat[members].sum(axis=1), num_slots, floor)
    local = Passed(current, members, passed.work)
    budget = min(passed.work + tuning.levels_descent_work, tuning.levels_work)
    moved = True
    while moved and local.work < budget:
        moved = False
        for target in _targets(_tops(flat, members, num_slots, floor), floor):
            repair(flat, members, _caps(target.tolist(), num_slots), num_slots, floor, local, tuning)
            if local.path < current:
                members, current, moved = local.members, local.path, True
                break
            if local.work >= budget:
                break
    passed.work = local.work
    if local.path < passed.path:
        passed.path, passed.members = local.path, local.members


def levels_replanned(
    flat: np.ndarray, plans: list[np.ndarray], path: int, num_slots: int, floor: int, tuning: WindowTuning
) -> tuple[list[np.ndarray], int]:
    """The plan (per micro-batch (G, k) flat indices) and its critical path after the level search from
    ``plans`` (whose path is ``path``), for windows of two or more micro-batches, 2 to
    ``tuning.levels_max_per_slot`` samples per slot, at most ``tuning.levels_max_samples`` samples and at most ``tuning.levels_distinct_percent`` distinct costs
    per 100 samples (repeated costs: text-only zeros, images of a few sizes); ``plans`` when it finds
    nothing better."""
    count = len(plans)
    if count < 2 or flat.shape[0] > tuning.levels_max_samples or not 2 <= plans[0].shape[1] <= tuning.levels_max_per_slot:
        return plans, path
    if np.unique(flat).shape[0] * 100 > flat.shape[0] * tuning.levels_distinct_percent:
        return plans, path
    members = np.concatenate(plans)
    passed = Passed(path, members)
    tried: dict[bytes, np.ndarray | None] = {}
    light_limit = max(floor, int(flat.sum()) // (count * num_slots * tuning.levels_light_share))
    for light in range(min(count, tuning.levels_max_light + 1)):
        if light and light_levels(flat, light, num_slots, plans[0].shape[1], floor)[0] > light_limit:
            break  # light micro-batches no cheaper than half the mean slot load: nothing to gain
        for top_last in (False, True):
            reached = _bisected(flat, passed.members, count, num_slots, floor, light, top_last, passed, tried, tuning)
            if reached is not None:
                _descended(flat, reached, num_slots, floor, passed, tuning)
            if passed.work >= tuning.levels_work:
                break
    if passed.path >= path:
        return plans, path
    order = np.argsort(-flat[passed.members].sum(axis=1), kind="stable")
    grouped = passed.members[order]
    return [grouped[m * num_slots : (m + 1) * num_slots] for m in range(count)], passed.path
