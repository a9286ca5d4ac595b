"""Branch and bound over the slots of a small window with the micro-batches left out of the search.

For any split of the window's W*B samples into W*G bins of k = B/G samples, the best grouping of the
bins into micro-batches sorts them heaviest first and cuts them into runs of G: the path is the sum over
j of max(floor, the (jG+1)-th heaviest bin). So the search only decides which samples share a bin, and
every bin is like every other: the grouping is read off the loads at the end. This removes the
symmetries that a search over micro-batch labels must explore (the same bins under other groupings,
bins of equal loads in different micro-batches), and treats samples of equal cost as one kind:

* **Branching.** Samples are placed heaviest first. A sample goes into one bin of each *state* (load and
  fill; bins in the same state are interchangeable, so only the lowest-numbered is tried), and a sample
  that costs the same as the one before it only into bins numbered at least as high as that one's
  (equal costs are interchangeable: any plan can be relabelled so that they fill bins in order, and the
  rules combine as in ``exact``). Children are tried by their bound, then by bin number. Once only zero
  costs are left, every completion has the same loads: the plan is complete.
* **Bound.** A bin ends at least at its load plus its missing places' share of the lightest samples, and
  order statistics grow with every bin, so the path is at least the sum over j of max(floor, the
  (jG+1)-th largest of those). And the lightest (W-j)G bins end with all the cost the others cannot
  take: the total less the jG largest loads and less what the jG bins could still receive (at most the
  heaviest samples left, as many as the places the jG emptiest bins still have); their micro-batches'
  tops sum to at least that over G.
On windows of a few distinct costs (text-only zeros, images on a few resolutions) it reaches the optimum in
tens of placements where the labelled search ``window_search`` needs thousands; on windows of many distinct
costs the labelled search's per-micro-batch room bound cuts more. The window planner runs this one first,
then the labelled one, on one budget.

* **Budget.** As ``window_search``: strictly below ``incumbent``, stop at ``lower``, at most
  ``node_limit`` samples placed (a count, never a clock); ``proven`` says the search finished.
"""

from __future__ import annotations

from mimo_pipes.balance.search.budget import BudgetSpent, filled_in_order, prefix_totals, runs_to_the_end
from mimo_pipes.balance.search.window_search import WindowSearch


def _grouped_path(loads: list[int], num_slots: int, floor: int) -> int:
    """Path of final bin loads grouped heaviest first into runs of ``num_slots``."""
    ordered = sorted(loads, reverse=True)
    return sum(max(floor, top) for top in ordered[::num_slots])


def _micro_batch_bins(bin_of: list[int], loads: list[int], num_slots: int) -> list[int]:
    """Renumber bins so that micro-batch m holds bins m*G .. m*G+G-1, heaviest bins first (ties by bin)."""
    order = sorted(range(len(loads)), key=lambda b: (-loads[b], b))
    rename = [0] * len(loads)
    for position, b in enumerate(order):
        rename[b] = position
    return [rename[b] for b in bin_of]


def _bound(tables: tuple, nxt: int) -> int:
    """Lower bound on the path of any completion, samples ``nxt`` onwards still to place. ``tables``: the
    search's bin loads and fills (as they stand), prefix totals and shape (see ``search_bins``)."""
    load, fill, tails, heads, total, per_bin, num_slots, floor, count = tables
    lows = sorted([amount + tails[per_bin - filled] for amount, filled in zip(load, fill)], reverse=True)
    tops = [top if top > floor else floor for top in lows[::num_slots]]  # one a micro-batch
    value = sum(tops)
    held = sorted(load, reverse=True)
    missing = sorted([per_bin - filled for filled in fill], reverse=True)
    start = heads[nxt]
    left = total - start  # cost of the samples still to place
    taken = 0  # the jG heaviest loads
    places = 0  # the jG largest numbers of missing places
    head = 0  # sum of the first j tops
    for j in range(1, count):
        for b in range((j - 1) * num_slots, j * num_slots):
            taken += held[b]
            places += missing[b]
        head += tops[j - 1]
        absorbed = heads[nxt + places] - start
        if absorbed > left:
            absorbed = left
        rest = total - taken - absorbed  # at least what the lightest (W-j)G bins hold
        tail = -(-rest // num_slots)
        if tail > value - head:
            value = head + tail
    return max(value, -(-total // num_slots))


def search_bins(
    costs: list[int], count: int, num_slots: int, floor: int, incumbent: int, lower: int, node_limit: int
) -> WindowSearch:
    """Look for a plan of ``count`` micro-batches of ``num_slots`` bins whose critical path is below
    ``incumbent``; ``costs`` are plain ints sorted heaviest first, their number a multiple of
    ``count * num_slots``. The result's ``bins`` number bins by micro-batch (m*G + g)."""
    size = len(costs)
    bins = count * num_slots
    per_bin = size // bins
    if incumbent <= lower or per_bin == 0:
        return WindowSearch(None, incumbent, True, 0)
    total = sum(costs)
    tails, heads = prefix_totals(costs, size + 1)  # the n lightest samples' total; the i heaviest's
    load = [0] * bins
    fill = [0] * bins
    tables = (load, fill, tails, heads, total, per_bin, num_slots, floor, count)
    bin_of = [0] * size
    best = incumbent
    found: list[int] | None = None
    nodes = node_limit

    def place(i: int) -> bool:
        nonlocal best, found, nodes
        if i == size or costs[i] == 0:
            path = _grouped_path(load, num_slots, floor)
            if path < best:
                found = _micro_batch_bins(filled_in_order(bin_of, i, fill, per_bin), load, num_slots)
                best = path
            return best <= lower
        cost = costs[i]
        first = bin_of[i - 1] if i and costs[i - 1] == cost else 0
        seen = set()
        children = []
        for b in range(first, bins):
            filled = fill[b]
            if filled == per_bin:
                continue
            key = (load[b], filled)
            if key in seen:
                continue
            seen.add(key)
            load[b] += cost
            fill[b] = filled + 1
            value = _bound(tables, i + 1)
            load[b] -= cost
            fill[b] = filled
            if value < best:
                children.append((value, b))
        children.sort()
        for value, b in children:
            if value >= best:
                break
            nodes -= 1
            if nodes < 0:
                raise BudgetSpent
            load[b] += cost
            fill[b] += 1
            bin_of[i] = b
            done = place(i + 1)
            load[b] -= cost
            fill[b] -= 1
            if done:
                return True
        return False

    proven = runs_to_the_end(place)
    return WindowSearch(found, best, proven or best <= lower, node_limit - max(nodes, 0))
