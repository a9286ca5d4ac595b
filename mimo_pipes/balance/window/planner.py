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
   the best plan so far. Windows the exact searches did not settle are searched pair by pair
   (``pairs``), then, when their costs repeat, over levels (``levels``: the W micro-batch tops chosen at
   once), each never returning a worse plan.
5. Last, the window as it stands (contiguous slots, nothing moves) wins if it is no worse.

docs/balancing.md has the details.

Output order: within a slot, ascending flat indices (m*B + j); slots of a micro-batch ordered by their
smallest index; micro-batches ordered by their smallest index when samples may move, in window order
otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mimo_pipes.balance.canonical import sort_order
from mimo_pipes.balance.quality import window_lower_bound, window_path_bound
from mimo_pipes.balance.validate import check_floor, check_window
from mimo_pipes.balance.window.compositions import compositions, estimate
from mimo_pipes.balance.window.exact_searches import searched
from mimo_pipes.balance.window.improve import improve
from mimo_pipes.balance.window.levels import levels_replanned
from mimo_pipes.balance.window.pairs import pairs_replanned
from mimo_pipes.balance.window.plans import canonical_microbatch, loads_path, plan_path
from mimo_pipes.balance.window.starts import balanced, fill_to_level, independent, pairs_to_level
from mimo_pipes.balance.window.tuning import TUNING, WindowTuning


def balance_window(
    costs: Sequence[Sequence[int]],
    num_slots: int,
    across_microbatches: bool = False,
    floor: int = 0,
    *,
    tuning: WindowTuning = TUNING,
) -> list[list[list[int]]]:
    """Balance a window of W micro-batches of B samples each over ``num_slots`` slots.

    Returns, per micro-batch, per slot, indices into the flattened window (m*B + j). Every micro-batch
    keeps B samples and every slot B/G. With ``across_microbatches`` False, micro-batch m holds exactly
    its own samples m*B .. m*B+B-1, balanced as by :func:`balance_microbatch`. With True, samples may
    move between the window's micro-batches to lower the critical path (sum of heaviest slots).
    ``floor`` (an int >= 0, in cost units) is the least a forward costs however light its slot: the
    critical path is then the sum of max(floor, heaviest slot), and with ``across_microbatches`` False a
    micro-batch whose slots all stay below it does not move. ``tuning``: the planner's budgets and
    thresholds (:class:`~mimo_pipes.balance.window.tuning.WindowTuning`).
    Raises ValueError on invalid costs, micro-batches of different sizes, an empty window, a size not
    divisible by ``num_slots``, or a floor that, W times over with the window's costs, leaves the exact
    range (``MAX_TOTAL_COST``).
    """
    window = check_window(costs, num_slots)
    num_slots = int(num_slots)
    floor = check_floor(floor, window)
    if not across_microbatches:
        plans, _ = independent(window, num_slots, anchor=False, floor=floor)
        return [canonical_microbatch(plan) for plan in plans]
    count, size = window.shape
    if size == 0:
        return [[[] for _ in range(num_slots)] for _ in range(count)]
    result = [canonical_microbatch(plan) for plan in _across(window, num_slots, floor, tuning)]
    result.sort(key=lambda slots: min((slot[0] for slot in slots if slot), default=0))
    return result


def _across(window: np.ndarray, num_slots: int, floor: int, tuning: WindowTuning) -> list[np.ndarray]:
    """The plan of a window whose samples may move between micro-batches (steps 1 to 5 above)."""
    count, size = window.shape
    flat = window.reshape(-1)
    order = sort_order(flat)
    still = np.arange(count * size, dtype=np.int64).reshape(count, size)
    # The window as it stands is a composition too (and no plan that keeps every sample in its
    # micro-batch costs less than its estimate): estimated first, so it wins ties.
    still_rows = np.argsort(-window, axis=1, kind="stable") + still[:, :1]  # rows sorted, flat indices
    pick, chosen, still_estimate = _chosen_composition(flat, still_rows, order, count, num_slots, floor, tuning)
    search = size // num_slots > 1 and flat.shape[0] <= tuning.search_max_samples
    if search:
        candidates = _search_starts(window, order, chosen, pick, num_slots, floor, tuning)
    else:
        # No search follows: balance the chosen composition alone, each micro-batch for its heaviest slot
        # and no lower than the floor (the exact search on small micro-batches when it is the window as
        # it stands, as each would be balanced alone).
        candidates = [balanced(flat, chosen, num_slots, floor, exact=pick == 0, heaviest_only=True)]
    plans, path = candidates[0], None
    for plan in candidates:
        value = plan_path(flat, plan, floor)
        if path is None or value < path:
            plans, path = plan, value
    if (search or pick) and path > still_estimate:
        plans, path = _against_the_anchor(window, still_rows, plans, path, num_slots, floor, search)
    if not search and size // num_slots > 1 and flat.shape[0] <= tuning.certify_max_samples:
        plans, path = _certified(window, order, plans, path, num_slots, floor, tuning)
    if search:
        plans, path = _exact_and_pairs(window, order, plans, path, num_slots, floor, candidates, tuning)
    # Nothing moves if the window as it stands (contiguous slots) is at least as good.
    if loads_path(window.reshape(count, num_slots, -1).sum(axis=2), floor) <= path:
        plans = [rows.reshape(num_slots, -1) for rows in still]
    return plans


def _exact_and_pairs(
    window: np.ndarray,
    order: np.ndarray,
    plans: list[np.ndarray],
    path: int,
    num_slots: int,
    floor: int,
    starts: list[list[np.ndarray]],
    tuning: WindowTuning,
) -> tuple[list[np.ndarray], int]:
    """Step 4's searches: the pair searches (from ``plans`` and the other ``starts``), then the exact ones;
    with ``tuning.pairs_after_exact`` the exact searches first and the pair searches only when those did not
    prove their plan optimal (a window of a few distinct costs is then never searched pair by pair)."""
    flat = window.reshape(-1)
    exact = flat.shape[0] <= max(tuning.exact_max_samples, tuning.count_max_samples)
    if tuning.pairs_after_exact:
        proven = False
        if exact:
            plans, path, proven = searched(window, order, plans, path, num_slots, floor, tuning)
        if not proven:
            plans, path = pairs_replanned(flat, order, plans, path, num_slots, floor, starts, tuning)
            plans, path = _levels(flat, order, plans, path, num_slots, floor, tuning)
        return plans, path
    plans, path = pairs_replanned(flat, order, plans, path, num_slots, floor, starts, tuning)
    plans, path = _levels(flat, order, plans, path, num_slots, floor, tuning)
    if exact:
        plans, path, _ = searched(window, order, plans, path, num_slots, floor, tuning)
    return plans, path


def _levels(
    flat: np.ndarray, order: np.ndarray, plans: list[np.ndarray], path: int, num_slots: int, floor: int,
    tuning: WindowTuning,
) -> tuple[list[np.ndarray], int]:
    """The search over levels, unless the plan is within 1/``tuning.levels_near_bound`` of the path bound."""
    bound = window_path_bound(flat[order], len(plans), num_slots, floor)
    if (path - bound) * tuning.levels_near_bound <= bound:
        return plans, path
    return levels_replanned(flat, plans, path, num_slots, floor, tuning)


def _chosen_composition(
    flat: np.ndarray,
    still_rows: np.ndarray,
    order: np.ndarray,
    count: int,
    num_slots: int,
    floor: int,
    tuning: WindowTuning,
) -> tuple[int, np.ndarray, int]:
    """(number, rows, the window as it stands' estimate) of the composition with the lowest estimate: 0 is the
    window as it stands (``still_rows``), then ``compositions`` in order; the first of the lowest wins.
    Scored one at a time, so memory stays a few windows however many compositions there are."""
    pick, chosen = 0, still_rows
    still_estimate = best = estimate(flat[still_rows], num_slots, floor)
    for number, rows in enumerate(compositions(order, count, num_slots, floor, tuning), start=1):
        value = estimate(flat[rows], num_slots, floor)
        if value < best:
            pick, chosen, best = number, rows, value
    return pick, chosen, still_estimate


def _search_starts(
    window: np.ndarray,
    order: np.ndarray,
    chosen: np.ndarray,
    pick: int,
    num_slots: int,
    floor: int,
    tuning: WindowTuning,
) -> list[list[np.ndarray]]:
    """The plans a window small enough to search starts from, each improved by swaps across micro-batches
    unless the sorted runs are already within 1/``near_bound`` of the window bound.

    The starts of the former planner stay (sorted runs, balanced as before; the engine on every micro-batch
    where it stands is the anchor), with the same trigger for the search, so the result is never worse than
    it was; the chosen composition is one more start."""
    count, size = window.shape
    flat = window.reshape(-1)
    runs = balanced(flat, order.reshape(count, size), num_slots, 0)
    candidates = [runs] if pick in (0, 1) else [balanced(flat, chosen, num_slots, 0), runs]
    # Within 1/near_bound of a valid lower bound the search cannot gain enough to pay for itself.
    bound = max(window_lower_bound(window, num_slots), floor * count)
    first = plan_path(flat, runs, floor)
    if (first - bound) * tuning.near_bound <= bound:
        return candidates
    candidates = [improve(flat, plan, num_slots, floor, tuning) for plan in candidates]
    if flat.shape[0] <= tuning.fill_max_samples:
        candidates.append(improve(flat, fill_to_level(window, num_slots, floor), num_slots, floor, tuning))
        if count > 1:
            level = fill_to_level(window, num_slots, floor, opened=1)
            candidates.append(improve(flat, level, num_slots, floor, tuning))
    if size == 2 * num_slots:
        pairs = pairs_to_level(flat, order, count, num_slots, floor)
        candidates.append(improve(flat, pairs, num_slots, floor, tuning))
    return candidates


def _against_the_anchor(
    window: np.ndarray,
    still_rows: np.ndarray,
    plans: list[np.ndarray],
    path: int,
    num_slots: int,
    floor: int,
    search: bool,
) -> tuple[list[np.ndarray], int]:
    """Balancing every micro-batch where it stands could still be better: never return worse than LPT does
    that way (or, with a floor and a window small enough to search, than the engine's own per-micro-batch
    plan for the heaviest slots). The caller skips it when the bound of the window as it stands shows it
    cannot win, or when that plan was the one balanced."""
    flat = window.reshape(-1)
    if floor and search:
        anchor = balanced(flat, still_rows, num_slots, floor, exact=True, heaviest_only=True)
    else:
        anchor, _ = independent(window, num_slots, anchor=True)
    value = plan_path(flat, anchor, floor)
    if value < path:
        return anchor, value
    return plans, path


def _certified(
    window: np.ndarray,
    order: np.ndarray,
    plans: list[np.ndarray],
    path: int,
    num_slots: int,
    floor: int,
    tuning: WindowTuning,
) -> tuple[list[np.ndarray], int]:
    """A window too large to search: fill to level as one more start, only when the path bound cannot
    certify the plan within 1/``certify_gap`` of the optimum."""
    count = window.shape[0]
    flat = window.reshape(-1)
    bound = window_path_bound(flat[order], count, num_slots, floor)
    if (path - bound) * tuning.certify_gap > bound:
        level = fill_to_level(window, num_slots, floor, opened=1)
        value = plan_path(flat, level, floor)
        if value < path:
            return level, value
    return plans, path
