"""The balancer's searches as first written, plainly, kept to check that faster versions return exactly the same:
a plan is the same on every rank and in every version, so a rewrite for speed must not change a single index.

``reference_repair`` is ``level_repair.repair`` with its table of swaps written out (d = held[s] - held[t] for
every source s and target t); ``reference_search_slots`` is ``exact.search_slots`` with its state in a dict."""

from __future__ import annotations

import numpy as np

from mimo_pipes.balance.search.budget import BudgetSpent, filled_in_order, runs_to_the_end

_BLOCKED = np.int64(1) << 40


def reference_repair(
    flat: np.ndarray,
    members: np.ndarray,
    caps: np.ndarray,
    num_slots: int,
    floor: int,
    passed,
    tuning,
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


def reference_search_slots(
    costs: list[int], num_slots: int, incumbent: int | None, lower: int, node_limit: int
) -> tuple[list[int] | None, int, bool, int]:
    """The search itself, on a plain list of costs sorted heaviest first.

    Returns (slot of each sample or None, best heaviest load, proven, nodes used).
    """
    size = len(costs)
    per_slot = size // num_slots
    total = sum(costs)
    if incumbent is None:
        incumbent = total + 1
    if incumbent <= lower or per_slot == 0:
        return None, incumbent, True, 0
    # tails[r]: sum of the r lightest costs.
    tails = [0]
    for c in reversed(costs):
        tails.append(tails[-1] + c)
    costs = [*costs, 0]  # a zero past the end: having placed every sample is a leaf like any zero cost left
    loads = [0] * num_slots
    fill = [0] * num_slots
    slot_of = [0] * size
    state = {"best": incumbent, "found": None, "nodes": node_limit, "full": 0, "full_sum": 0}

    def place(rank: int) -> bool:
        """Returns True when the lower bound has been reached (stop everything)."""
        cost = costs[rank]
        if cost == 0:
            # Only zero costs remain (or none): any completion keeps today's loads.
            top = max(loads)
            if top < state["best"]:
                state["best"] = top
                state["found"] = filled_in_order(slot_of, rank, fill, per_slot)
            return state["best"] <= lower
        best = state["best"]
        limit = best - 1
        # Slack wasted by full slots must leave room for everything still to place.
        if state["full"] * limit - state["full_sum"] > num_slots * limit - total:
            return False
        # Samples of equal cost are interchangeable: their slots need only be tried in
        # non-decreasing slot order.
        first = slot_of[rank - 1] if rank and costs[rank - 1] == cost else 0
        order = sorted((loads[s], s) for s in range(first, num_slots) if fill[s] < per_slot)
        seen = set()
        for load, s in order:
            key = (load, fill[s])
            if key in seen:
                continue
            seen.add(key)
            if load + cost + tails[per_slot - fill[s] - 1] > limit:
                continue
            state["nodes"] -= 1
            if state["nodes"] < 0:
                raise BudgetSpent
            loads[s] = load + cost
            fill[s] += 1
            slot_of[rank] = s
            if fill[s] == per_slot:
                state["full"] += 1
                state["full_sum"] += loads[s]
            done = place(rank + 1)
            if fill[s] == per_slot:
                state["full"] -= 1
                state["full_sum"] -= loads[s]
            fill[s] -= 1
            loads[s] = load
            if done:
                return True
            if state["best"] <= best - 1:
                best = state["best"]
                limit = best - 1
        return False

    proven = runs_to_the_end(place)
    nodes = node_limit - max(state["nodes"], 0)
    best = state["best"]
    return state["found"], best, proven or best <= lower, nodes
