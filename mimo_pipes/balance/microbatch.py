"""The micro-batch engine.

1. Sort the costs by (-cost, index) and work on ranks (see ``canonical``). Tiny micro-batches (at
   most 40 possible partitions) are solved by trying every partition instead.
2. Start from the better of equal-count LPT and balanced Karmarkar-Karp, by (heaviest, spread).
3. Swap refinement (``refine``) towards a cheap lower bound.
4. If the heaviest slot is still more than 0.5% above the bound, a second start: best-fit
   decreasing against a target halfway between the bound and the result (``best_fit``), refined;
   the better of the two is kept.
5. If it is still above the bound and the micro-batch has at most 256 samples, exact re-partitions
   of three slots at a time (``repartition``), continued with a second node budget when the first
   runs out while the result is still more than 0.8% above the bound (a count-based trigger, so
   only the few hard micro-batches pay for it); with at most 16 samples, exact branch and bound
   (``exact``) with a node budget, then refinement of the spread.
6. Keep LPT if it is better (it never is, by construction, but the guarantee is checked), and keep
   the samples where they are (the contiguous split) if that is at least as good: then nothing
   needs to move between ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mimo_pipes.balance.canonical import loads_of, score, slots_in_canonical_order, sort_order
from mimo_pipes.balance.heuristics.best_fit import best_fit_members
from mimo_pipes.balance.heuristics.karmarkar_karp import kk_members
from mimo_pipes.balance.heuristics.lpt import lpt_members
from mimo_pipes.balance.heuristics.refine import refine_members
from mimo_pipes.balance.heuristics.repartition import repartition_search
from mimo_pipes.balance.quality import sorted_lower_bound
from mimo_pipes.balance.search.exact import enumerate_members, exact_members, partition_count
from mimo_pipes.balance.validate import check_costs, check_floor

# Work after refinement, only while the heaviest slot is above the cheap lower bound:
# a best-fit restart when the gap to the bound is large (more than 1/RESTART_GAP of it),
# three-slot exact re-partitions (node budget), then exact search on small micro-batches.
RESTART_GAP = 200
# Tiny micro-batches (B <= 6, or 8 samples over 2 slots) are solved by trying every partition.
ENUMERATE_MAX_PARTITIONS = 40
REPARTITION_NODES = 2_000
REPARTITION_MAX_SAMPLES = 256
# If the three-slot search ran out of nodes while the heaviest slot is still more than
# 1/EXTRA_GAP (0.8%) above the lower bound, it continues with REPARTITION_EXTRA_NODES more. A search
# that ended on its own is not continued: it would repeat the same failed tries.
EXTRA_GAP = 125
REPARTITION_EXTRA_NODES = 2_000
EXACT_MAX_SAMPLES = 16
EXACT_NODE_LIMIT = 4_000
# Karmarkar-Karp is a second start only up to this many samples: beyond, refinement from LPT alone
# lands as low or lower (and KK costs as much as a refinement round).
KK_MAX_SAMPLES = 64


def plan_members(
    sorted_costs: np.ndarray, num_slots: int, exact: bool = True, floor: int = 0, heaviest_only: bool = False
) -> np.ndarray:
    """Balanced rank-space assignment (G, B/G) for costs sorted heaviest first.

    For a window's micro-batches: ``floor``, a heaviest load at or below it is as good as any (a forward
    costs at least the floor): the start is kept once its heaviest slot is there, and no search goes
    below it; ``heaviest_only``, the spread does not matter (LPT is the only start, and see
    ``refine_members``). Either way the result is never worse than LPT by (heaviest, spread)."""
    size = int(sorted_costs.shape[0])
    per_slot = size // num_slots
    if num_slots == 1 or per_slot <= 1:
        # One slot, or one sample per slot: every assignment has the same loads.
        return np.arange(size, dtype=np.int64).reshape(num_slots, per_slot)
    if size <= 12 and partition_count(size, num_slots) <= ENUMERATE_MAX_PARTITIONS:
        # A few dozen partitions: try them all (optimal by (heaviest, spread), never worse than LPT).
        return enumerate_members(sorted_costs, num_slots)
    lower = sorted_lower_bound(sorted_costs, num_slots, thorough=False)
    anchor = lpt_members(sorted_costs, num_slots)
    anchor_score = score(loads_of(sorted_costs, anchor))
    start, start_score = anchor, anchor_score
    # Heaviest slot alone (window micro-batches), or many samples: LPT is the only start.
    if not heaviest_only and size <= KK_MAX_SAMPLES:
        other = kk_members(sorted_costs, num_slots)
        other_score = score(loads_of(sorted_costs, other))
        if other_score <= start_score:
            start, start_score = other, other_score
    if start_score[0] <= floor:
        return start
    lower = max(lower, floor)
    best = refine_members(sorted_costs, start, target=lower, heaviest_only=heaviest_only)
    best_loads = loads_of(sorted_costs, best)
    top = int(best_loads.max())
    if (top - lower) * RESTART_GAP > lower:
        # The cheap bound can be loose (e.g. few very heavy samples): tighten it before deciding.
        lower = max(sorted_lower_bound(sorted_costs, num_slots, thorough=True, max_extra=num_slots), floor)
    if (top - lower) * RESTART_GAP > lower:
        # Well above the bound: restart from best fit against a target halfway down.
        limit = lower + (top - lower) // 2
        other = refine_members(
            sorted_costs, best_fit_members(sorted_costs, num_slots, limit), lower, heaviest_only=heaviest_only
        )
        other_loads = loads_of(sorted_costs, other)
        if score(other_loads) < score(best_loads):
            best, best_loads, top = other, other_loads, int(other_loads.max())
    if top > lower and size <= REPARTITION_MAX_SAMPLES:
        best, resume = repartition_search(sorted_costs, best, lower, REPARTITION_NODES)
        best_loads = loads_of(sorted_costs, best)
        top = int(best_loads.max())
        if resume is not None and (top - lower) * EXTRA_GAP > lower:
            # Still far from the bound and the search was cut short: continue it with more nodes.
            best, _ = repartition_search(
                sorted_costs, best, lower, REPARTITION_EXTRA_NODES, resume=resume
            )
            best_loads = loads_of(sorted_costs, best)
            top = int(best_loads.max())
    if exact and top > lower and size <= EXACT_MAX_SAMPLES:
        found = exact_members(
            sorted_costs, num_slots, incumbent=top, lower=lower, node_limit=EXACT_NODE_LIMIT
        ).members
        if found is not None:
            best = refine_members(sorted_costs, found, target=lower)
            best_loads = loads_of(sorted_costs, best)
    # Guarantee: never worse than the anchor by (heaviest, spread).
    if score(best_loads) > anchor_score:
        return anchor
    return best


def plan_indices(costs: np.ndarray, num_slots: int, exact: bool = True, floor: int = 0) -> np.ndarray:
    """(G, B/G) matrix of sample indices for validated int64 ``costs`` (rows = slots, unordered).

    The contiguous split is kept when it is at least as good once every load below ``floor`` counts as
    ``floor`` (a forward costs at least that): a micro-batch that is all below the floor does not move."""
    size = int(costs.shape[0])
    per_slot = size // num_slots
    contiguous = np.arange(size, dtype=np.int64).reshape(num_slots, per_slot)
    if num_slots == 1 or per_slot <= 1:
        return contiguous
    order = sort_order(costs)
    sorted_costs = costs[order]
    planned = order[plan_members(sorted_costs, num_slots, exact=exact)]
    if score(np.maximum(loads_of(costs, contiguous), floor)) <= score(np.maximum(loads_of(costs, planned), floor)):
        return contiguous
    return planned


def balance_microbatch(costs: Sequence[int], num_slots: int, floor: int = 0) -> list[list[int]]:
    """Split one micro-batch into ``num_slots`` slots of equal sample count, balancing the load.

    Returns G lists of sample indices: each list ascending, lists ordered by their smallest index.
    Minimises the heaviest slot load, then the spread; never worse than equal-count LPT on either
    (compared lexicographically). When the contiguous split (slot s = indices s*B/G ..) is at least
    as good, it is returned, so balanced input moves nothing; with a per-forward ``floor`` (int >= 0)
    loads below it count as the floor in that comparison. Deterministic: depends on the costs alone.
    Raises ValueError for non-integer or negative costs, ``num_slots`` < 1, or a size not divisible
    by ``num_slots``.
    """
    array = check_costs(costs, num_slots)
    indices = plan_indices(array, int(num_slots), floor=check_floor(floor))
    return slots_in_canonical_order(indices, np.arange(array.shape[0], dtype=np.int64))
