"""Swaps across micro-batches that lower a window plan's critical path, then refinement inside the micro-batches
they touched."""

from __future__ import annotations

import numpy as np

from mimo_pipes.balance.canonical import sort_order
from mimo_pipes.balance.heuristics.refine import refine_members
from mimo_pipes.balance.window.tuning import WindowTuning


def improve(flat: np.ndarray, plans: list[np.ndarray], num_slots: int, floor: int, tuning: WindowTuning) -> list[np.ndarray]:
    """Swaps across micro-batches that lower the critical path, then refinement inside the touched ones.

    The slots of the whole window are "bins" of k samples; for any bin loads the best grouping into
    micro-batches sorts the bins heaviest first and cuts them into runs of G (each micro-batch then costs
    its first bin). A move swaps one sample of a micro-batch's heaviest bin with a lighter sample of a
    bin in another micro-batch: taken if the critical path falls, or stays and the bin leaves a tie at
    the top of its micro-batch while the other bin stays below its micro-batch's top. The bins are
    regrouped after every move. Budgets are counts (moves, candidate pairs looked at), never a clock.
    """
    count = len(plans)
    members = np.concatenate(plans)  # (W*G, k) flat indices
    bins, per_bin = members.shape
    if count == 1 or per_bin == 0:
        return plans
    loads = flat[members].sum(axis=1)
    touched = np.zeros(bins, dtype=bool)
    work = 0
    moves = 0
    stale = 0  # micro-batches tried since the last move
    m = 0
    while stale < count and moves < tuning.max_moves and work < tuning.max_work:
        order = np.argsort(-loads, kind="stable")
        heads = order[::num_slots]
        tops = loads[heads]
        group = np.empty(bins, dtype=np.int64)
        group[order] = np.arange(bins) // num_slots
        top = int(tops[m])
        if top <= floor:
            stale, m = stale + 1, (m + 1) % count
            continue
        i = int(heads[m])
        second = int(loads[order[m * num_slots + 1]]) if num_slots > 1 else -1
        x = flat[members[i]]  # (k,)
        other = group != m
        y_bins = np.flatnonzero(other)
        y = flat[members[y_bins]]  # (n, k)
        d = x[:, None, None] - y[None, :, :]  # (k, n, k)
        work += max(d.size, tuning.iteration_work)
        new_i = top - d
        gain = max(top, floor) - np.maximum(np.maximum(second, new_i), floor)
        top_j = tops[group[y_bins]][None, :, None]
        load_j = loads[y_bins][None, :, None]
        new_j = load_j + d
        loss = np.maximum(np.maximum(top_j, new_j), floor) - np.maximum(top_j, floor)
        delta = np.where(d > 0, loss - gain, 1)
        plateau = (delta == 0) & (second == top) & (new_j < top_j) & (new_i < top)
        score = np.where(delta < 0, delta, np.where(plateau, 0, 1))
        best = int(score.min())
        if best > 0:
            stale, m = stale + 1, (m + 1) % count
            continue
        # The largest fall first; among equals the gentlest swap (smallest difference), then the lowest position.
        candidates = np.flatnonzero((score == best).reshape(-1))
        pick = int(candidates[np.argmin(d.reshape(-1)[candidates])])
        a, n, b = np.unravel_index(pick, d.shape)
        j = int(y_bins[n])
        members[i, a], members[j, b] = members[j, b], members[i, a]
        moved = int(d[a, n, b])
        loads[i] -= moved
        loads[j] += moved
        touched[i] = touched[j] = True
        moves += 1
        stale = 0
    return regrouped(flat, members, loads, touched, count, num_slots, tuning.light_rounds)


def regrouped(
    flat: np.ndarray, members: np.ndarray, loads: np.ndarray, touched: np.ndarray, count: int, num_slots: int, rounds: int
) -> list[np.ndarray]:
    """The bins (``members``, (W*G, k) flat indices, with their ``loads``) grouped heaviest first into runs of
    G, one run a micro-batch; a micro-batch holding a ``touched`` bin refined inside (``rounds`` rounds)."""
    order = np.argsort(-loads, kind="stable")
    improved = []
    for m in range(count):
        rows = order[m * num_slots : (m + 1) * num_slots]
        chosen = members[rows]
        if touched[rows].any():
            # Swap refinement inside the micro-batch, from where the moves left it (never raises its top).
            samples = chosen.reshape(-1)
            sub_order = sort_order(flat[samples])
            rank = np.empty_like(sub_order)
            rank[sub_order] = np.arange(sub_order.shape[0])
            start = rank.reshape(chosen.shape)
            chosen = samples[sub_order][refine_members(flat[samples][sub_order], start, max_rounds=rounds)]
        improved.append(chosen)
    return improved
