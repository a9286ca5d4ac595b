"""Windows of W micro-batches: balance each one on its own, or let samples move between them.

Across micro-batches (opt-in), the objective is the vision critical path: the sum over the window's
micro-batches of max(floor, heaviest slot). The planner:

1. Compositions (which samples form each micro-batch): the window as it stands, sorted runs of B (optimal
   with one sample per slot), chunks of G dealt back and forth, with a floor hybrids of the two, and runs
   completed with the lightest samples, ranked by a batched lower bound (no balancing needed to rank them).
2. Windows of more than 2048 samples take the best composition, each micro-batch balanced by the engine
   for its heaviest slot.
3. Smaller windows also start from sorted runs (and the search across micro-batches when they are more
   than 0.1% above the window bound), heads then fill, fill to level, and pairs filled to a level.
4. The best plan is compared with balancing every micro-batch where it stands (when a bound says it could
   win); then exact searches try to beat it. Windows of at most 8 distinct costs (text-only zeros, images
   of a few resolutions) and at most 256 samples, whose bins come in at most 70 kinds, first go to a search
   over counts of each cost (``count_search``: bins as multisets of costs, plans as multisets of bins),
   which is optimal when it finishes within its budget; windows of at most 64 samples that it did not
   settle go on to the branch and bounds over samples (``bin_search``, then ``window_search``), each from
   the best plan so far.
5. Last, the window as it stands (contiguous slots, nothing moves) wins if it is no worse.

docs/balancing.md has the details.

Output order: within a slot, ascending flat indices (m*B + j); slots of a micro-batch ordered by their
smallest index; micro-batches ordered by their smallest index when samples may move, in window order
otherwise.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np

from mimo_pipes.balance.bin_search import search_bins
from mimo_pipes.balance.canonical import loads_of, sort_order
from mimo_pipes.balance.count_search import count_types, search_counts
from mimo_pipes.balance.lpt import lpt_members
from mimo_pipes.balance.microbatch import plan_indices, plan_members
from mimo_pipes.balance.quality import rows_lower_bound, window_lower_bound, window_path_bound
from mimo_pipes.balance.refine import refine_members
from mimo_pipes.balance.validate import check_floor, check_window
from mimo_pipes.balance.window_pairs import pairs_replanned
from mimo_pipes.balance.window_search import WindowSearch, search_window

# Budgets of the search across micro-batches (counts, so the result never depends on the machine):
# swaps taken, and candidate swaps looked at (a few ms of numpy on a busy 2-core machine).
MAX_MOVES = 512
MAX_WORK = 200_000
# An iteration counts at least this much work (its fixed cost: a sort of the bins, a few small arrays).
ITERATION_WORK = 2_000
# The second start (heads, then fill to level) places one sample at a time: only for windows this small.
FILL_MAX_SAMPLES = 2048
# The search (and the second start) only for windows of at most this many samples: above it an iteration
# looks at too many pairs to pay for itself within the budgets.
SEARCH_MAX_SAMPLES = 2048
# The search runs only while the sorted runs are more than 1/NEAR_BOUND (0.1%) above the window bound.
NEAR_BOUND = 1000
# Refinement rounds inside a micro-batch after the moves across micro-batches touched it.
LIGHT_ROUNDS = 2
# Windows of at most this many samples (two or more per slot) end with a branch and bound over every
# plan (``window_search``), the best plan so far as incumbent, with this budget of samples placed.
EXACT_MAX_SAMPLES = 64
EXACT_NODES = 500
# Windows of at most this many distinct costs get this many times the budget for the search over bins.
FEW_COSTS = 8
FEW_COSTS_FACTOR = 10
# Windows of at most FEW_COSTS distinct costs whose bins come in at most COUNT_MAX_TYPES kinds (k samples of
# d costs: C(d+k-1, k) kinds) start with the exact search over counts, on this much work (``count_search``:
# about 5,000 states bounded, tens of ms).
COUNT_MAX_TYPES = 70
COUNT_WORK = 400_000
# ... and windows of up to this many samples (above EXACT_MAX_SAMPLES it is their only search).
COUNT_MAX_SAMPLES = 256
# The search over unlabelled bins goes first when the window has at most 1/TIES as many distinct costs as
# samples (equal costs are what it does not repeat).
TIES = 2
# Windows too large to search (up to CERTIFY_MAX_SAMPLES) get one more start, fill to level, only when
# the path bound cannot certify the plan within 1/CERTIFY_GAP (3%) of the optimum: it places one sample at
# a time (tens of ms at 4096 samples), which windows near their bound do not pay.
CERTIFY_GAP = 33
CERTIFY_MAX_SAMPLES = 4096
# Each composition is scored in time linear in the window, so their number is bounded: all of a family when
# it has at most COMPOSITIONS_DENSE members, else those and then members that grow by at least 1/16 each
# (a few hundred at most for any window), so large windows stay linear in their samples.
COMPOSITIONS_DENSE = 32
COMPOSITIONS_GROWTH = 16


def _canonical_microbatch(indices: np.ndarray) -> list[list[int]]:
    """(G, k) flat indices -> canonical list of slots."""
    if indices.size == 0:
        return [[] for _ in range(indices.shape[0])]
    rows = np.sort(indices, axis=1)
    return rows[np.argsort(rows[:, 0], kind="stable")].tolist()


def _independent(window: np.ndarray, num_slots: int, anchor: bool, floor: int = 0) -> tuple[list[np.ndarray], int]:
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


def _path(loads: np.ndarray, floor: int) -> int:
    """Critical path of (W, G) slot loads: every forward costs at least ``floor``."""
    if loads.size == 0:
        return 0
    return int(np.maximum(loads.max(axis=1), floor).sum())


def _plan_path(flat: np.ndarray, plan: list[np.ndarray], floor: int) -> int:
    """Critical path of a plan: per-micro-batch (G, k) flat indices."""
    return _path(np.stack([flat[rows].sum(axis=1) for rows in plan]), floor)


def _compositions(order: np.ndarray, count: int, num_slots: int, floor: int) -> Iterator[np.ndarray]:
    """Ways to choose which samples form each micro-batch: (W, B) flat indices each, every row in sorted
    order, in the order of preference on ties (the window as it stands is the caller's, before these).

    ``runs`` gives micro-batch m the m-th run of B sorted samples (like samples together: right without a
    floor). ``snake`` cuts the sorted samples into chunks of G (one sample per slot) and deals them to the
    micro-batches back and forth, so every micro-batch gets heavy and light samples, none sits below the
    floor, and a heavy chunk's samples can each have a slot of their own. With a floor, hybrids keep the
    h heaviest runs and deal the rest. Runs with f fillers (f a power of two or a multiple of G below B)
    complete each run of B - f with the f lightest samples left. Their number grows with W and B/G, so
    they are made one at a time: a caller that scores each and keeps the best holds a few windows' worth
    of memory, never all of them at once."""
    size = order.shape[0] // count
    runs = order.reshape(count, size)
    yield runs
    yield _snake(order, count, num_slots)
    if floor and size > num_slots:
        for heads in _thinned(list(range(1, count - 1))):
            yield np.concatenate((runs[:heads], _snake(order[heads * size :], count - heads, num_slots)))
    if count > 1 and size > num_slots:
        for fillers in _filler_counts(size, num_slots):
            yield _with_fillers(order, count, size, fillers)


def _filler_counts(size: int, num_slots: int) -> list[int]:
    """The numbers of fillers tried: powers of two and multiples of G below B, ascending (thinned)."""
    powers = {1 << i for i in range(size.bit_length()) if 1 << i < size}
    return _thinned(sorted(powers | set(range(num_slots, size, num_slots))))


def _thinned(values: list[int]) -> list[int]:
    """``values`` (ascending, positive) when there are at most COMPOSITIONS_DENSE of them; else the first
    COMPOSITIONS_DENSE, then each value at least 1/COMPOSITIONS_GROWTH above the last kept, and the last."""
    if len(values) <= COMPOSITIONS_DENSE:
        return values
    kept = values[:COMPOSITIONS_DENSE]
    for value in values[COMPOSITIONS_DENSE:-1]:
        if value * COMPOSITIONS_GROWTH >= kept[-1] * (COMPOSITIONS_GROWTH + 1):
            kept.append(value)
    kept.append(values[-1])
    return kept


def _with_fillers(order: np.ndarray, count: int, size: int, fillers: int) -> np.ndarray:
    """Sorted runs of B - ``fillers`` samples, each completed with the ``fillers`` lightest samples left
    (the first run with the lightest of all); the last micro-batch takes the middle. A run that holds a
    few very heavy samples can then give each a slot of light ones under its top: (W, B) flat indices."""
    total = count * size
    heavy = size - fillers
    m = np.arange(count, dtype=np.int64)[:, None]
    j = np.arange(size, dtype=np.int64)[None, :]
    # Positions in the sorted order: the m-th heavy run, then the m-th group of fillers from the end.
    positions = np.where(j < heavy, m * heavy + j, total - (m + 1) * fillers + (j - heavy))
    positions[-1] = (count - 1) * heavy + j[0]
    return order[positions]


def _snake(order: np.ndarray, count: int, num_slots: int) -> np.ndarray:
    """Chunks of G sorted samples dealt to ``count`` micro-batches back and forth: (count, B) flat indices."""
    chunks = order.reshape(-1, count, num_slots).copy()
    chunks[1::2] = chunks[1::2, ::-1]
    return chunks.transpose(1, 0, 2).reshape(count, -1)


def _estimate(sorted_rows: np.ndarray, num_slots: int, floor: int) -> int:
    """Lower bound on the critical path of a composition (W, B), rows sorted heaviest first: each
    balanced micro-batch costs at least max(floor, its lower bound). Balanced by the engine they come
    close to it, so it ranks compositions without balancing them."""
    return int(np.maximum(rows_lower_bound(sorted_rows, num_slots), floor).sum())


def _balanced(
    flat: np.ndarray, rows: np.ndarray, num_slots: int, floor: int, exact: bool = False, heaviest_only: bool = False
) -> list[np.ndarray]:
    """Each row (flat indices in sorted order) balanced by the engine (``heaviest_only``: for its heaviest
    slot alone, since the spread of a micro-batch does not change the critical path): per-micro-batch
    (G, k) flat indices."""
    return [
        row[plan_members(flat[row], num_slots, exact=exact, floor=floor, heaviest_only=heaviest_only)] for row in rows
    ]


def _fill_to_level(window: np.ndarray, num_slots: int, floor: int, opened: int | None = None) -> list[np.ndarray]:
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


def _pairs_to_level(flat: np.ndarray, order: np.ndarray, count: int, num_slots: int, floor: int) -> list[np.ndarray]:
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


def _improve(flat: np.ndarray, plans: list[np.ndarray], num_slots: int, floor: int) -> list[np.ndarray]:
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
    while stale < count and moves < MAX_MOVES and work < MAX_WORK:
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
        work += max(d.size, ITERATION_WORK)
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
            chosen = samples[sub_order][refine_members(flat[samples][sub_order], start, max_rounds=LIGHT_ROUNDS)]
        improved.append(chosen)
    return improved


def _branch_and_bound(
    values: list[int], count: int, num_slots: int, floor: int, result: WindowSearch, lower: int
) -> WindowSearch:
    """The searches over samples, from ``result`` (the best plan so far: its ``bins``, or None for the
    planner's own, and its path).

    With many equal costs (at most half as many distinct costs as samples: text-only zeros, images of a few
    resolutions), first over bins alone (no micro-batch labels: equal costs and equal bins are tried once,
    whatever micro-batch they would sit in), on a budget of its own; then, unless that proved its result, the
    labelled search (its per-micro-batch room bound cuts more where costs differ) from the best plan so far,
    on the whole budget, so a window with ties is never searched less than one without. Each starts from the
    best plan before it, so a better start never ends worse (its search visits a part of the same tree, in
    the same order)."""
    distinct = len(set(values))
    if distinct * TIES <= len(values):
        # A few distinct costs leave few distinct plans, each of which the search over bins tries once: a
        # larger budget there reaches the optimum that the labelled search (which tries every labelling) cannot.
        budget = EXACT_NODES * FEW_COSTS_FACTOR if distinct <= FEW_COSTS else EXACT_NODES
        binned = search_bins(values, count, num_slots, floor, result.best, lower, budget)
        if binned.bins is not None or binned.proven:
            result = WindowSearch(binned.bins or result.bins, binned.best, binned.proven, binned.nodes)
    if not result.proven:
        labelled = search_window(values, count, num_slots, floor, result.best, lower, EXACT_NODES)
        if labelled.bins is not None:
            result = labelled
    return result


def _searched(
    window: np.ndarray, order: np.ndarray, plans: list[np.ndarray], path: int, num_slots: int, floor: int
) -> tuple[list[np.ndarray], int]:
    """The plan (and its critical path) after the exact searches that try to beat ``path``: over counts
    (windows of a few distinct costs, up to COUNT_MAX_SAMPLES samples), then, unless that proved its plan
    optimal, over samples (up to EXACT_MAX_SAMPLES). They stop early at a lower bound of the window, so a
    plan on it is not searched at all."""
    count, size = window.shape
    flat = window.reshape(-1)
    costs = flat[order]
    values = costs.tolist()
    distinct = len(set(values))
    # A few distinct costs: an exact search over counts of each cost (bins as types, plans as multisets of
    # them), on a budget of its own; its answer is optimal when it finishes.
    counted = (
        len(values) <= COUNT_MAX_SAMPLES
        and distinct <= FEW_COSTS
        and count_types(distinct, size // num_slots) <= COUNT_MAX_TYPES
    )
    if not counted and len(values) > EXACT_MAX_SAMPLES:
        return plans, path
    lower = window_path_bound(costs, count, num_slots, floor)
    if (path - lower) * NEAR_BOUND <= lower:
        return plans, path  # within 0.1% of the bound: the search cannot gain enough to pay for itself
    result = WindowSearch(None, path, False, 0)
    if counted:
        result = search_counts(values, count, num_slots, floor, path, lower, COUNT_WORK)
    if not result.proven and len(values) <= EXACT_MAX_SAMPLES:
        result = _branch_and_bound(values, count, num_slots, floor, result, lower)
    if result.bins is None:
        return plans, path
    bins = np.asarray(result.bins, dtype=np.int64)
    # Samples in sorted order, grouped by bin (a stable sort keeps each bin's samples in rank order).
    members = order[np.argsort(bins, kind="stable")].reshape(count, num_slots, -1)
    return list(members), result.best


def balance_window(
    costs: Sequence[Sequence[int]], num_slots: int, across_microbatches: bool = False, floor: int = 0
) -> list[list[list[int]]]:
    """Balance a window of W micro-batches of B samples each over ``num_slots`` slots.

    Returns, per micro-batch, per slot, indices into the flattened window (m*B + j). Every micro-batch
    keeps B samples and every slot B/G. With ``across_microbatches`` False, micro-batch m holds exactly
    its own samples m*B .. m*B+B-1, balanced as by :func:`balance_microbatch`. With True, samples may
    move between the window's micro-batches to lower the critical path (sum of heaviest slots).
    ``floor`` (an int >= 0, in cost units) is the least a forward costs however light its slot: the
    critical path is then the sum of max(floor, heaviest slot), and with ``across_microbatches`` False a
    micro-batch whose slots all stay below it does not move.
    Raises ValueError on invalid costs, micro-batches of different sizes, an empty window, a size not
    divisible by ``num_slots``, or a floor that, W times over with the window's costs, leaves the exact
    range (``MAX_TOTAL_COST``).
    """
    window = check_window(costs, num_slots)
    num_slots = int(num_slots)
    floor = check_floor(floor, window)
    if not across_microbatches:
        plans, _ = _independent(window, num_slots, anchor=False, floor=floor)
        return [_canonical_microbatch(plan) for plan in plans]
    count, size = window.shape
    flat = window.reshape(-1)
    order = sort_order(flat)
    still = np.arange(count * size, dtype=np.int64).reshape(count, size)
    if size == 0:
        return [[[] for _ in range(num_slots)] for _ in range(count)]
    # The window as it stands is a composition too (and no plan that keeps every sample in its
    # micro-batch costs less than its estimate): estimated first, so it wins ties.
    still_rows = np.argsort(-window, axis=1, kind="stable") + still[:, :1]  # rows sorted, flat indices
    # Scored one at a time (memory stays a few windows, however many compositions there are); the first
    # of the lowest wins.
    pick, chosen = 0, still_rows
    still_estimate = best = _estimate(flat[still_rows], num_slots, floor)
    for number, rows in enumerate(_compositions(order, count, num_slots, floor), start=1):
        value = _estimate(flat[rows], num_slots, floor)
        if value < best:
            pick, chosen, best = number, rows, value
    search = size // num_slots > 1 and flat.shape[0] <= SEARCH_MAX_SAMPLES
    if search:
        # The starts of the former planner stay (sorted runs, balanced as before; the engine on every
        # micro-batch where it stands is the anchor below), with the same trigger for the search, so
        # the result is never worse than it was; the chosen composition is one more start.
        runs = _balanced(flat, order.reshape(count, size), num_slots, 0)
        candidates = [runs] if pick in (0, 1) else [_balanced(flat, chosen, num_slots, 0), runs]
        # Within 1/NEAR_BOUND of a valid lower bound the search cannot gain enough to pay for itself.
        bound = max(window_lower_bound(window, num_slots), floor * count)
        first = _plan_path(flat, runs, floor)
        if (first - bound) * NEAR_BOUND > bound:
            candidates = [_improve(flat, plan, num_slots, floor) for plan in candidates]
            if flat.shape[0] <= FILL_MAX_SAMPLES:
                candidates.append(_improve(flat, _fill_to_level(window, num_slots, floor), num_slots, floor))
                if count > 1:
                    level = _fill_to_level(window, num_slots, floor, opened=1)
                    candidates.append(_improve(flat, level, num_slots, floor))
            if size == 2 * num_slots:
                pairs = _pairs_to_level(flat, order, count, num_slots, floor)
                candidates.append(_improve(flat, pairs, num_slots, floor))
    else:
        # No search follows: balance the chosen composition alone, each micro-batch for its heaviest slot
        # and no lower than the floor (the exact search on small micro-batches when it is the window as
        # it stands, as each would be balanced alone).
        candidates = [_balanced(flat, chosen, num_slots, floor, exact=pick == 0, heaviest_only=True)]
    plans, path = candidates[0], None
    for plan in candidates:
        value = _plan_path(flat, plan, floor)
        if path is None or value < path:
            plans, path = plan, value
    if (search or pick) and path > still_estimate:
        # Balancing every micro-batch where it stands could still be better: never return worse than LPT
        # does that way (or, with a floor and a window small enough to search, than the engine's own
        # per-micro-batch plan for the heaviest slots). Skipped when the bound of the window as it stands
        # shows it cannot win, or when that plan was the one balanced.
        if floor and search:
            anchor = _balanced(flat, still_rows, num_slots, floor, exact=True, heaviest_only=True)
        else:
            anchor, _ = _independent(window, num_slots, anchor=True)
        value = _plan_path(flat, anchor, floor)
        if value < path:
            plans, path = anchor, value
    if not search and size // num_slots > 1 and flat.shape[0] <= CERTIFY_MAX_SAMPLES:
        bound = window_path_bound(flat[order], count, num_slots, floor)
        if (path - bound) * CERTIFY_GAP > bound:
            level = _fill_to_level(window, num_slots, floor, opened=1)
            value = _plan_path(flat, level, floor)
            if value < path:
                plans, path = level, value
    if search:
        plans, path = pairs_replanned(flat, order, plans, path, num_slots, floor, candidates)
    if search and flat.shape[0] <= max(EXACT_MAX_SAMPLES, COUNT_MAX_SAMPLES):
        plans, path = _searched(window, order, plans, path, num_slots, floor)
    # Nothing moves if the window as it stands (contiguous slots) is at least as good.
    if _path(window.reshape(count, num_slots, -1).sum(axis=2), floor) <= path:
        plans = [rows.reshape(num_slots, -1) for rows in still]
    result = [_canonical_microbatch(plan) for plan in plans]
    result.sort(key=lambda slots: min((slot[0] for slot in slots if slot), default=0))
    return result
