"""Swap refinement of an equal-count assignment.

Every move exchanges one sample (or two) of a slot with as many samples of another slot, so every slot
keeps B/G samples. A move between a heavier slot h and a lighter slot l that shifts d from h to l is
allowed only if 0 < d < load(h) - load(l): both new loads then lie strictly between the old ones.
Such a move never raises the heaviest load, never lowers the lightest, and strictly lowers the sum of
squared loads, so the objective (heaviest, spread) never gets worse and refinement always ends. Among
allowed moves for a slot, the one that leaves the pair closest to level is taken.

Stages, each bounded by a count (never a clock):

1. Paired passes. Slots are sorted by load (stable); the i-th heaviest is paired with a light slot
   (the i-th lightest, then shifted by one more each pass) and every pair gets its best 1-1 swap, all
   at once. Cheap, and it removes most of the imbalance of the starting assignment.
2. Neighbour rounds. The heaviest slots above ``target`` (a lower bound) each look for a swap that
   sends one of their samples for a slightly lighter one: the candidates for a sample of rank r are
   ranks r+1 .. r+w (costs are sorted, so neighbouring ranks hold the closest costs). The lightest
   slots do the same upwards, scored on the same loads in the same array operations (the costs that
   such swaps move are a table built once per refinement). Non-conflicting moves (each slot in one
   move) are applied together, the heaviest slots' first, then the lightest ones'. Rounds stop when
   they no longer change the heaviest or lightest load.
3. Focused moves. When the neighbour rounds stall above ``target``, the heaviest slot tries every
   1-1 swap with every slot, then 2-2 swaps with the lightest few slots; any success goes back to 2.

Ties go to the first candidate in (slot, position, rank) order and slots are ordered by stable sorts,
so the result is a function of the sorted costs and the starting matrix.

Memory stays linear in the input (the table of neighbour moves holds 2w integers a sample). The best swap between two slots is found on a dense table of every
pair of candidates while that table is small (it is for the usual tens of samples per slot); beyond
``DENSE_ELEMENTS`` the same best swap (same ties) is found slot by slot with a sorted search. The
2-2 swaps look at every pair of samples of a slot, so they are skipped past ``MAX_PAIRS`` pairs per
slot (about 1,450 samples), where 1-1 swaps already level the loads finely.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_NONE = np.iinfo(np.int64).max

PAIRED_PASSES = 4
NEIGHBOUR_SLOTS = 16
NEIGHBOUR_WINDOW = 8
MAX_ROUNDS = 6
FOCUSED_PAIR_PARTNERS = 8
_STEPS = np.arange(1, NEIGHBOUR_WINDOW + 1, dtype=np.int64)
# Far beyond any cost (totals are below 2**62), small enough that sums with it stay in int64.
_SENTINEL = 2**61
# Largest dense table of candidate swaps (int64 elements, 16 MiB) by default; larger searches go slot by
# slot (``refine_members(dense_elements=...)``).
DENSE_ELEMENTS = 1 << 21
# Most pairs of samples per slot that 2-2 swaps consider (each pair list costs 8 bytes a pair).
MAX_PAIRS = 1 << 20


@lru_cache(maxsize=4)
def _pairs(per_slot: int) -> tuple[np.ndarray, np.ndarray]:
    first, second = np.triu_indices(per_slot, k=1)
    return first.astype(np.int64), second.astype(np.int64)


def _best_swap(give: np.ndarray, take: np.ndarray, gap: int) -> tuple[int, int, int] | None:
    """The swap of one ``give[i]`` for one ``take[j]`` that moves d = give[i] - take[j] with 0 < d < gap
    and leaves the pair closest to level (largest min(d, gap - d)); ties to the smallest i, then j.

    Returns (min(d, gap - d), i, j), or None. Memory linear in the inputs: a sorted search of ``take``
    for each ``give`` (the dense tables below compare every i with every j)."""
    if gap < 2 or give.size == 0 or take.size == 0:
        return None
    order = np.argsort(take, kind="stable")
    ordered = take[order]
    # d >= gap/2 exactly when 2 * take[j] <= 2 * give[i] - gap: the largest such take is the best of
    # that side, the next larger take the best of the other side.
    split = np.searchsorted(2 * ordered, 2 * give - gap, side="right")
    best = np.zeros(give.size, dtype=np.int64)
    pick = np.zeros(give.size, dtype=np.int64)
    for candidate in (split - 1, split):  # the lower side first: its ties keep the smaller j below
        inside = (candidate >= 0) & (candidate < ordered.size)
        at = np.where(inside, candidate, 0)
        value = ordered[at]
        d = give - value
        level = np.where(inside & (d > 0) & (d < gap), np.minimum(d, gap - d), 0)
        first = order[np.searchsorted(ordered, value, side="left")]  # the first j holding that value
        better = (level > best) | ((level == best) & (level > 0) & (first < pick))
        best = np.where(better, level, best)
        pick = np.where(better, first, pick)
    i = int(np.argmax(best))
    if best[i] == 0:
        return None
    return int(best[i]), i, int(pick[i])


class _Assignment:
    """A rank-space assignment with loads and reverse lookups, updated by swaps."""

    def __init__(self, sorted_costs: np.ndarray, members: np.ndarray, dense_elements: int = DENSE_ELEMENTS) -> None:
        size = sorted_costs.shape[0]
        self.dense_elements = dense_elements
        self.costs = sorted_costs
        self.members = members.copy()
        self.values = sorted_costs[self.members]
        num_slots, per_slot = members.shape
        self.loads = self.values.sum(axis=1)
        # Ranks are stored shifted by NEIGHBOUR_WINDOW so that a neighbour past either end (see
        # neighbour_tables) still reads a slot; its move is never taken.
        self.slot_of_padded = np.zeros(size + 2 * NEIGHBOUR_WINDOW, dtype=np.int64)
        self.slot_of = self.slot_of_padded[NEIGHBOUR_WINDOW : NEIGHBOUR_WINDOW + size]
        self.pos_of = np.empty(size, dtype=np.int64)
        self.slot_of[self.members] = np.arange(num_slots)[:, None]
        self.pos_of[self.members] = np.arange(per_slot)[None, :]
        # Costs by rank with sentinels past either end (rank r at r + NEIGHBOUR_WINDOW + 1): a swap with a
        # rank past the end moves a negative cost, which is never taken.
        pad = np.full(NEIGHBOUR_WINDOW + 1, _SENTINEL, dtype=np.int64)
        self.padded_costs = np.concatenate((-pad, sorted_costs, pad))

    def neighbour_moves(self, ranks: np.ndarray, partners: np.ndarray, sign: np.ndarray) -> np.ndarray:
        """The cost d that moves when rank r swaps with its partner (a padded rank, r's place in
        ``slot_of_padded``): d = c[r] - c[partner] down (``sign`` +1: the partner is lighter), c[partner] -
        c[r] up (-1). Only the ranks a round looks at are computed, so memory stays that of the round."""
        return sign * (self.costs.take(ranks)[..., None] - self.padded_costs.take(partners + 1))

    def swap(self, first, second) -> None:
        """Exchange the samples of ranks ``first`` and ``second``: two ranks, or two equal-length
        arrays of ranks in which no slot appears twice."""
        if isinstance(first, np.ndarray):
            ranks, partners = np.concatenate((first, second)), np.concatenate((second, first))
        else:
            ranks, partners = np.array((first, second)), np.array((second, first))
        slots, positions = self.slot_of[ranks], self.pos_of[ranks]
        incoming = self.costs[partners]
        self.loads[slots] += incoming - self.costs[ranks]  # every slot appears once
        self.members[slots, positions] = partners
        self.values[slots, positions] = incoming
        self.slot_of[partners] = slots  # each partner takes the place its rank left
        self.pos_of[partners] = positions

    def extremes(self) -> tuple[int, int]:
        return int(self.loads.max()), int(self.loads.min())


@lru_cache(maxsize=64)
def _pairing(num_slots: int, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in the ascending load order of a paired pass's heavy slots (heaviest first) and of
    their light partners (the i-th lightest, shifted by ``shift``)."""
    half = num_slots // 2
    heavy = np.arange(num_slots - 1, num_slots - half - 1, -1, dtype=np.int64)
    return heavy, (np.arange(half, dtype=np.int64) + shift) % half


def _paired_pass(state: _Assignment, shift: int) -> bool:
    num_slots, per_slot = state.values.shape
    half = num_slots // 2
    heavy_at, light_at = _pairing(num_slots, shift % half)
    order = np.argsort(state.loads, kind="stable")
    heavy = order[heavy_at]
    light = order[light_at]
    if half * per_slot * per_slot <= state.dense_elements:
        # Swapping d = x - y from a heavy slot (load h) to a light one (l) leaves the pair at
        # max(h - d, l + d): below h exactly when 0 < d < h - l, and least when closest to level.
        high = state.loads.take(heavy)
        values = state.values
        diff = values.take(heavy, axis=0)[:, :, None] - values.take(light, axis=0)[:, None, :]  # (P, k, k)
        pair = np.maximum(high[:, None, None] - diff, state.loads.take(light)[:, None, None] + diff)
        pair = pair.reshape(half, -1)
        pick = np.argmin(pair, axis=1)
        moving = pair[np.arange(half), pick] < high
        i, j = np.divmod(pick[moving], per_slot)
    else:  # the same swaps, pair by pair
        found = [
            _best_swap(state.values[h], state.values[lo], int(state.loads[h] - state.loads[lo]))
            for h, lo in zip(heavy.tolist(), light.tolist())
        ]
        moving = np.array([swap is not None for swap in found])
        i = np.array([swap[1] for swap in found if swap is not None], dtype=np.int64)
        j = np.array([swap[2] for swap in found if swap is not None], dtype=np.int64)
    if not moving.any():
        return False
    state.swap(state.members[heavy[moving], i], state.members[light[moving], j])
    return True


@lru_cache(maxsize=64)
def _focus(num_slots: int, heaviest_only: bool) -> tuple[np.ndarray, ...]:
    """For a neighbour round over ``num_slots`` slots: the positions in the ascending load order of the
    slots it looks at (the heaviest first, then, unless ``heaviest_only``, the lightest); each one's sign
    (+1 down, -1 up), (m, 1, 1); and its steps to its partners in padded rank space, (m, 1, w)."""
    count = min(NEIGHBOUR_SLOTS, num_slots)
    heavy = np.arange(num_slots - 1, num_slots - count - 1, -1, dtype=np.int64)
    up = np.zeros(count, dtype=bool) if heaviest_only else np.repeat([False, True], count)
    positions = heavy if heaviest_only else np.concatenate((heavy, np.arange(count, dtype=np.int64)))
    sign = np.where(up, -1, 1).astype(np.int64)[:, None, None]
    steps = NEIGHBOUR_WINDOW + sign * _STEPS
    return positions, sign, steps


def _neighbour_round(state: _Assignment, target: int, heaviest_only: bool) -> int:
    """One round of neighbour swaps: each of the heaviest slots above ``target`` sends one sample for a
    slightly lighter one, and (unless ``heaviest_only``) each of the lightest slots takes a slightly
    heavier one, all scored on the same loads in one set of array operations. Returns the moves made.

    Down, a slot of load L gives d and its partner's load P becomes P + d: allowed if that stays below
    L, scored max(L - d, P + d). Up is the same on negated loads (-L gives d, -P becomes -P + d), so
    one expression serves both sides, and the smallest score is the move nearest to level."""
    loads = state.loads
    positions, sign, steps = _focus(loads.shape[0], heaviest_only)
    focus = np.argsort(loads, kind="stable")[positions]
    ranks = state.members[focus]  # (m, k)
    own = (loads.take(focus) * sign[:, 0, 0])[:, None, None]  # (m, 1, 1)
    count, per_slot = ranks.shape
    best = np.empty(count, dtype=np.int64)
    chosen_own = np.empty(count, dtype=np.int64)
    chosen = np.empty(count, dtype=np.int64)
    # Scored a few slots at a time, so a round holds at most about DENSE_ELEMENTS values however large
    # the micro-batch (one slot at a time for the largest).
    step = max(1, state.dense_elements // (per_slot * NEIGHBOUR_WINDOW))
    for lo in range(0, count, step):
        part = slice(lo, lo + step)
        partner = ranks[part, :, None] + steps[part]  # padded ranks, (p, k, w)
        diff = state.neighbour_moves(ranks[part], partner, sign[part])
        moved = loads.take(state.slot_of_padded.take(partner)) * sign[part] + diff
        # max(L - d, P + d) is below L exactly when the move is allowed (d > 0 and P + d < L).
        score = np.maximum(own[part] - diff, moved).reshape(partner.shape[0], -1)
        pick = np.argmin(score, axis=1)
        rows = np.arange(partner.shape[0])
        best[part] = score[rows, pick]
        chosen_own[part] = ranks[part][rows, pick // NEIGHBOUR_WINDOW]
        chosen[part] = partner.reshape(partner.shape[0], -1)[rows, pick]
    limit = own[:, 0, 0]
    if target:
        heavy = min(NEIGHBOUR_SLOTS, loads.shape[0])
        limit = limit.copy()
        limit[:heavy][limit[:heavy] <= target] = -_NONE  # heavy slots at or below the target stay
    found = (best < limit).tolist()
    chosen_own = chosen_own.tolist()
    partner_slot = state.slot_of_padded[chosen].tolist()
    chosen_partner = (chosen - NEIGHBOUR_WINDOW).tolist()
    focus_list = focus.tolist()
    busy = set()
    firsts, seconds = [], []
    for a in range(count):
        if not found[a]:
            continue
        s, o = focus_list[a], partner_slot[a]
        if s in busy or o in busy:
            continue
        busy.add(s)
        busy.add(o)
        firsts.append(chosen_own[a])
        seconds.append(chosen_partner[a])
    if firsts:
        state.swap(np.asarray(firsts), np.asarray(seconds))
    return len(firsts)




def _focused_scores(ref: int, loads: np.ndarray, diff: np.ndarray, lower: bool) -> np.ndarray:
    other = loads[:, None, None]
    if lower:
        allowed = (diff > 0) & (other + diff < ref)
        return np.where(allowed, np.maximum(ref - diff, other + diff), _NONE)
    allowed = (diff > 0) & (other - diff > ref)
    return np.where(allowed, -np.minimum(ref + diff, other - diff), _NONE)


def _best_focused(ref: int, own: np.ndarray, loads: np.ndarray, rows: np.ndarray, lower: bool, dense_elements: int) -> tuple[int, int, int] | None:
    """The best swap of one of ``own`` for one entry of a row of ``rows`` (slot loads ``loads``): for the
    heaviest slot (``lower``) it must not lift that slot to ``ref``, for the lightest not sink it.
    Returns (row, i, j): the first of the best in (row, i, j) order, as the dense tables pick."""
    sign = 1 if lower else -1
    if loads.size * own.size * rows.shape[1] <= dense_elements:
        diff = sign * (own[None, :, None] - rows[:, None, :])  # (rows, k, k)
        score = _focused_scores(ref, loads, diff, lower)
        flat = int(np.argmin(score))
        if score.flat[flat] == _NONE:
            return None
        o, i, j = (int(x) for x in np.unravel_index(flat, score.shape))
        return o, i, j
    best: tuple[int, int, int, int] | None = None  # (level, row, i, j)
    for o in range(loads.size):
        found = _best_swap(sign * own, sign * rows[o], sign * (ref - int(loads[o])))
        if found is not None and (best is None or found[0] > best[0]):
            best = (found[0], o, found[1], found[2])
    return None if best is None else best[1:]


def _focused_move(state: _Assignment, lower: bool) -> bool:
    """Best 1-1 swap of the heaviest (lightest) slot with any slot, else the best 2-2 swap with one of
    the few lightest (heaviest) slots. False if neither helps."""
    loads, values = state.loads, state.values
    per_slot = values.shape[1]
    s = int(np.argmax(loads)) if lower else int(np.argmin(loads))
    ref = int(loads[s])
    found = _best_focused(ref, values[s], loads, values, lower, state.dense_elements)
    if found is not None:
        o, i, j = found
        state.swap(int(state.members[s, i]), int(state.members[o, j]))
        return True
    if per_slot < 2 or per_slot * (per_slot - 1) // 2 > MAX_PAIRS:
        return False
    order = np.argsort(loads, kind="stable")
    partners = order[:FOCUSED_PAIR_PARTNERS] if lower else order[::-1][:FOCUSED_PAIR_PARTNERS]
    partners = partners[partners != s]
    first, second = _pairs(per_slot)
    sums = values[s, first] + values[s, second]
    partner_sums = values[partners][:, first] + values[partners][:, second]  # (p, P)
    found = _best_focused(ref, sums, loads[partners], partner_sums, lower, state.dense_elements)
    if found is None:
        return False
    o, p, q = found
    o = int(partners[o])
    give = (int(state.members[s, first[p]]), int(state.members[s, second[p]]))
    take = (int(state.members[o, first[q]]), int(state.members[o, second[q]]))
    state.swap(give[0], take[0])
    state.swap(give[1], take[1])
    return True


def refine_members(
    sorted_costs: np.ndarray,
    members: np.ndarray,
    target: int = 0,
    max_rounds: int | None = None,
    heaviest_only: bool = False,
    dense_elements: int = DENSE_ELEMENTS,
) -> np.ndarray:
    """Return a refined copy of the rank-space assignment ``members`` (G, k).

    ``dense_elements``: the largest dense table of candidate swaps; past it the same swaps (same ties) are
    found slot by slot (the result does not depend on it, only the memory and the time).
    ``target``: a lower bound on the heaviest load; slots at or below it are not lowered further.
    ``heaviest_only``: only the heaviest load matters (a window's critical path): no rounds that raise
    the lightest slots, and done as soon as the heaviest is at the target.
    """
    num_slots, per_slot = members.shape
    if num_slots < 2 or per_slot == 0:
        return members.copy()
    if max_rounds is None:
        max_rounds = MAX_ROUNDS
    state = _Assignment(sorted_costs, members, dense_elements)
    for shift in range(PAIRED_PASSES):
        if not _paired_pass(state, shift):
            break
    rounds = 0
    while rounds < max_rounds:
        # Neighbour rounds until they stop moving the extremes.
        before = state.extremes()
        stalled = 0
        while rounds < max_rounds:
            rounds += 1
            if heaviest_only and state.extremes()[0] <= target:
                return state.members
            moved = _neighbour_round(state, target, heaviest_only)
            now = state.extremes()
            if moved == 0:
                break
            stalled = stalled + 1 if now == before else 0
            before = now
            if stalled >= 2:
                break
        # A focused move on the heaviest slot; back to neighbour rounds after any success.
        rounds += 1
        if state.extremes()[0] > target and _focused_move(state, True):
            continue
        break
    return state.members
