"""Exact search (depth-first branch and bound) for the heaviest slot, for small micro-batches.

Samples are placed heaviest first. At each sample the slots that still have room are tried lightest
first (ties by slot number); slots in the same state (same load and fill) as one already tried at that
node are skipped, because exchanging them gives the same loads. A branch is cut when

* the slot would reach the incumbent even if its remaining places got the lightest samples left, or
* the room left under the incumbent in slots that are not full is smaller than the cost still to place
  (full slots waste their slack; the rest must absorb every remaining sample).

Samples of equal cost are interchangeable, so a sample that costs the same as the one before it only
tries slots numbered at least as high as that one's (this combines with the state rule above: among
slots in the same state the lowest-numbered allowed one is tried, and relabelling two such slots in
any completion keeps the equal-cost samples in non-decreasing slot order).

The search looks for an assignment strictly better than the incumbent, tightens the incumbent whenever
it finds one, and stops at the lower bound. It is bounded by a count of placements (``node_limit``),
never by a clock, so it returns the same answer on every machine. ``proven`` tells whether it finished.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mimo_pipes.balance.canonical import slots_in_canonical_order, sort_order
from mimo_pipes.balance.quality import sorted_lower_bound
from mimo_pipes.balance.search.budget import BudgetSpent, filled_in_order, runs_to_the_end
from mimo_pipes.balance.validate import check_costs

DEFAULT_NODE_LIMIT = 20_000




class SearchResult(NamedTuple):
    members: np.ndarray | None  # better assignment found (rank space), or None
    best: int  # heaviest load of ``members`` (the incumbent if nothing better was found)
    proven: bool  # True if no assignment better than ``best`` exists
    nodes: int  # placements tried


def exact_members(
    sorted_costs: np.ndarray,
    num_slots: int,
    incumbent: int | None = None,
    lower: int | None = None,
    node_limit: int = DEFAULT_NODE_LIMIT,
) -> SearchResult:
    """Search for an assignment whose heaviest slot is below ``incumbent``.

    ``incumbent`` None means "no solution yet" (anything is better). ``lower`` is a known lower bound
    (the search stops when it reaches it); None computes one.
    """
    if lower is None:
        lower = sorted_lower_bound(sorted_costs, num_slots)
    costs = [int(c) for c in sorted_costs.tolist()]
    found, best, proven, nodes = search_slots(costs, num_slots, incumbent, lower, node_limit)
    if found is None:
        return SearchResult(None, best, proven, nodes)
    per_slot = len(costs) // num_slots
    members = np.empty((num_slots, per_slot), dtype=np.int64)
    counts = [0] * num_slots
    for rank, s in enumerate(found):
        members[s, counts[s]] = rank
        counts[s] += 1
    return SearchResult(members, best, proven, nodes)


def search_slots(
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
    width = per_slot + 1  # slot states (load, fill) as one int: load * width + fill
    best_path, found, nodes, full, full_sum = incumbent, None, node_limit, 0, 0

    def place(rank: int) -> bool:
        """Returns True when the lower bound has been reached (stop everything)."""
        nonlocal best_path, found, nodes, full, full_sum
        cost = costs[rank]
        if cost == 0:
            # Only zero costs remain (or none): any completion keeps today's loads.
            top = max(loads)
            if top < best_path:
                best_path = top
                found = filled_in_order(slot_of, rank, fill, per_slot)
            return best_path <= lower
        best = best_path
        limit = best - 1
        # Slack wasted by full slots must leave room for everything still to place.
        if full * limit - full_sum > num_slots * limit - total:
            return False
        # Samples of equal cost are interchangeable: their slots need only be tried in
        # non-decreasing slot order.
        first = slot_of[rank - 1] if rank and costs[rank - 1] == cost else 0
        order = sorted([(loads[s], s) for s in range(first, num_slots) if fill[s] < per_slot])
        seen = set()
        for load, s in order:
            filled = fill[s]
            key = load * width + filled
            if key in seen:
                continue
            seen.add(key)
            if load + cost + tails[per_slot - filled - 1] > limit:
                continue
            nodes -= 1
            if nodes < 0:
                raise BudgetSpent
            loads[s] = load + cost
            fill[s] = filled + 1
            slot_of[rank] = s
            now_full = filled + 1 == per_slot
            if now_full:
                full += 1
                full_sum += load + cost
            done = place(rank + 1)
            if now_full:
                full -= 1
                full_sum -= load + cost
            fill[s] = filled
            loads[s] = load
            if done:
                return True
            if best_path <= best - 1:
                best = best_path
                limit = best - 1
        return False

    proven = runs_to_the_end(place)
    return found, best_path, proven or best_path <= lower, node_limit - max(nodes, 0)


def exact_assignment(
    costs: Sequence[int], num_slots: int, node_limit: int = DEFAULT_NODE_LIMIT
) -> tuple[list[list[int]], bool]:
    """Minimum-heaviest-slot assignment by branch and bound; returns (slots, proven optimal).

    With a node limit too small to finish, the best assignment found so far is returned (or, if none
    was found, equal-count LPT) and ``proven`` is False.
    """
    from mimo_pipes.balance.heuristics.lpt import lpt_members

    array = check_costs(costs, num_slots)
    order = sort_order(array)
    sorted_costs = array[order]
    start = lpt_members(sorted_costs, num_slots)
    incumbent = int(sorted_costs[start].sum(axis=1).max()) if start.size else 0
    result = exact_members(sorted_costs, num_slots, incumbent, node_limit=node_limit)
    members = start if result.members is None else result.members
    return slots_in_canonical_order(members, order), result.proven


def partition_count(size: int, num_slots: int) -> int:
    """Number of ways to split ``size`` samples into ``num_slots`` unlabelled slots of equal size."""
    per_slot = size // num_slots
    return math.factorial(size) // (math.factorial(per_slot) ** num_slots * math.factorial(num_slots))


def enumerate_members(sorted_costs: np.ndarray, num_slots: int) -> np.ndarray:
    """Best assignment by (heaviest, spread) over every equal-count partition, for tiny micro-batches.

    Partitions are visited in a fixed order (the lowest unplaced rank opens the next slot and takes
    companions in combination order); the first best one is kept. Pure Python: cheaper than the
    general engine when there are only a few dozen partitions.
    """
    costs = [int(c) for c in sorted_costs.tolist()]
    size = len(costs)
    per_slot = size // num_slots
    best_key = None
    best_rows: list[list[int]] = []
    rows: list[list[int]] = []
    loads: list[int] = []

    def visit(remaining: tuple[int, ...]) -> None:
        nonlocal best_key, best_rows
        if not remaining:
            key = (max(loads), max(loads) - min(loads))
            if best_key is None or key < best_key:
                best_key, best_rows = key, [row[:] for row in rows]
            return
        first, rest = remaining[0], remaining[1:]
        for companions in itertools.combinations(rest, per_slot - 1):
            row = [first, *companions]
            load = sum(costs[r] for r in row)
            if best_key is not None and load > best_key[0]:
                continue
            taken = set(companions)
            rows.append(row)
            loads.append(load)
            visit(tuple(r for r in rest if r not in taken))
            rows.pop()
            loads.pop()

    visit(tuple(range(size)))
    return np.asarray(best_rows, dtype=np.int64).reshape(num_slots, per_slot)
