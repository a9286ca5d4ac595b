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
        order = (-loads).argsort(kind="stable")
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
        # Sources: the samples of the slots over their caps; targets: every sample (positions, slot-major). Frozen:
        # samples swapped in the last tabu swaps, kept unless the swap reaches a new least excess.
        # (x.nonzero()[0]: np.flatnonzero's indices of a 1-D array, without its wrappers' cost at every swap.)
        excess_at = excess[slot_of]
        sources = excess_at.nonzero()[0]
        passed.work += sources.shape[0] * held.shape[0]
        delta = _swap_deltas(held, sources, room[slot_of], excess_at, per_slot)
        frozen = step - last[flat_members] <= tuning.levels_tabu
        if frozen.any():
            threshold = least - total
            for index in ((slice(None), frozen.nonzero()[0]), frozen[sources].nonzero()[0]):
                part = delta[index]
                part[part >= threshold] = _BLOCKED
                delta[index] = part
        best = int(delta.min())
        if best >= _BLOCKED:
            return None
        candidates = (delta.reshape(-1) == best).nonzero()[0]
        width = held.shape[0]
        moves = held[sources[candidates // width]] - held[candidates % width]
        pick = int(candidates[moves.argmin()])
        i, j = int(sources[pick // width]), pick % width
        moved = int(held[i] - held[j])
        last[flat_members[i]] = last[flat_members[j]] = step
        flat_members[i], flat_members[j] = flat_members[j], flat_members[i]
        held[i], held[j] = held[j], held[i]
        loads[slot_of[i]] -= moved
        loads[slot_of[j]] += moved
        if passed.work >= tuning.levels_work:
            return None
    return None


def _swap_deltas(
    held: np.ndarray, sources: np.ndarray, room_at: np.ndarray, excess_at: np.ndarray, per_slot: int
) -> np.ndarray:
    """(sources, positions) table of what each swap changes the excess by, _BLOCKED where the swap moves nothing
    heavier out of the source (d = held[s] - held[t] <= 0) or stays within one slot. ``room_at`` and
    ``excess_at``: each position's slot's load above its cap, and its positive part."""
    # The new excess of both slots is max(room[s's slot] - d, 0) + max(room[t's slot] + d, 0), less what they
    # have now: two outer sums with each slot's excess folded in (max(x, 0) - e = max(x - e, -e)), so no table
    # of d is built.
    source_held, source_excess = held[sources], excess_at[sources]
    delta = np.add.outer(room_at[sources] - source_held - source_excess, held)
    np.maximum(delta, -source_excess[:, None], out=delta)
    gain = np.add.outer(source_held, room_at - held - excess_at)
    np.maximum(gain, -excess_at, out=gain)
    delta += gain
    np.putmask(delta, np.less_equal.outer(source_held, held), _BLOCKED)
    own_slot = sources[:, None] - sources[:, None] % per_slot + np.arange(per_slot)  # positions are slot-major
    delta[np.arange(sources.shape[0])[:, None], own_slot] = _BLOCKED
    return delta
