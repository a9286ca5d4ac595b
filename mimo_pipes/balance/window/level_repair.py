"""Swaps toward level caps: a window's slots brought under given caps, one swap of two samples at a time.

With samples free to move between micro-batches, a plan's critical path depends only on the multiset of its
slot loads: sorted heaviest first and cut into runs of G, micro-batch m costs max(floor, the (mG+1)-th
heaviest load). A set of levels T_0 >= ... >= T_{W-1} is therefore reachable when the slots can be filled,
k samples each, so that the sorted loads stay under the sorted caps (G caps of each level). ``repair`` looks
for such a filling by swaps: the heaviest slot meets the highest cap, and so on down, and the excess is the
sum of what each load has above its cap. A swap exchanges a sample of a slot over its cap with a lighter
sample of any other slot; the swap that lowers the excess most is taken (ties: the smallest difference,
then the lowest position), and when none lowers it, the least harmful one (a tabu search: samples just
swapped stay put for a few swaps unless moving them reaches a new least excess). It stops when the excess
is 0, after a number of swaps without a new least excess, or on its budget (counts, never a clock). Every
slot keeps k samples. On the way it keeps the plan of least critical path it passed through, which a
search for levels uses even when the caps themselves are not reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mimo_pipes.balance.window.tuning import WindowTuning

_BLOCKED = np.int64(1) << 40


@dataclass
class Passed:
    """The plan of least critical path seen so far ((W*G, k) flat indices) and the work spent (candidate swaps
    looked at), shared by every repair of one search."""

    path: int
    members: np.ndarray
    work: int = 0


def sorted_path(loads: np.ndarray, num_slots: int, floor: int) -> int:
    """Critical path of slot loads grouped heaviest first into runs of ``num_slots``."""
    return int(np.maximum(np.sort(loads)[::-1][::num_slots], floor).sum())


def repair(
    flat: np.ndarray,
    members: np.ndarray,
    caps: np.ndarray,
    num_slots: int,
    floor: int,
    passed: Passed,
    tuning: WindowTuning,
) -> np.ndarray | None:
    """``members`` ((W*G, k) flat indices, not modified) after swaps that bring the sorted slot loads under the
    sorted ``caps`` (descending, one a slot), or None when the search stops first."""
    members = members.copy()
    bins, per_slot = members.shape
    flat_members = members.reshape(-1)  # a view: position p is slot p // k
    held = flat[flat_members]
    slot_of = np.repeat(np.arange(bins), per_slot)
    loads = held.reshape(bins, per_slot).sum(axis=1)
    last = np.full(flat.shape[0], -tuning.levels_tabu - 1, dtype=np.int64)  # the swap that last moved a sample
    least, stalled = None, 0
    for step in range(tuning.levels_repair_swaps):
        order = np.argsort(-loads, kind="stable")
        cap = np.empty(bins, dtype=np.int64)
        cap[order] = caps
        path = int(np.maximum(loads[order[::num_slots]], floor).sum())
        if path < passed.path:
            passed.path, passed.members = path, members.copy()
        room = loads - cap
        excess = np.maximum(room, 0)
        total = int(excess.sum())
        if total == 0:
            return members
        if least is None or total < least:
            least, stalled = total, 0
        else:
            stalled += 1
            if stalled > tuning.levels_stall:
                return None
        # Sources: the samples of the slots over their caps; targets: every sample (positions, slot-major).
        sources = np.flatnonzero(excess[slot_of])
        d = held[sources][:, None] - held[None, :]
        passed.work += d.size
        room_at, excess_at = room[slot_of], excess[slot_of]
        delta = np.maximum(room_at[sources][:, None] - d, 0) + np.maximum(room_at[None, :] + d, 0)
        delta -= excess_at[sources][:, None] + excess_at[None, :]
        frozen = step - last[flat_members] <= tuning.levels_tabu
        blocked = (d <= 0) | (slot_of[sources][:, None] == slot_of[None, :])
        blocked |= (frozen[sources][:, None] | frozen[None, :]) & (delta >= least - total)
        delta[blocked] = _BLOCKED
        best = int(delta.min())
        if best >= _BLOCKED:
            return None
        candidates = np.flatnonzero(delta.reshape(-1) == best)
        pick = int(candidates[np.argmin(d.reshape(-1)[candidates])])
        i, j = int(sources[pick // d.shape[1]]), pick % d.shape[1]
        moved = int(held[i] - held[j])
        last[flat_members[i]] = last[flat_members[j]] = step
        flat_members[i], flat_members[j] = flat_members[j], flat_members[i]
        held[i], held[j] = held[j], held[i]
        loads[slot_of[i]] -= moved
        loads[slot_of[j]] += moved
        if passed.work >= tuning.levels_work:
            return None
    return None
