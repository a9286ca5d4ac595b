"""Branch and bound for the critical path of a small window whose samples may cross micro-batches.

The window's W*B samples go into W*G bins of k = B/G samples, G bins to a micro-batch; the critical
path is the sum over micro-batches of max(floor, heaviest bin). Samples are placed heaviest first.

* **Branching.** A sample goes into a bin that still has room: of the micro-batches opened so far, or
  the first one not yet opened (unopened micro-batches are interchangeable). Within a micro-batch,
  bins in the same state (load and fill) are interchangeable and only the first is tried; a sample
  that costs the same as the one before it goes into a bin numbered at least as high (any plan can be
  relabelled that way). Children are tried by their bound, then by the room they leave in their bin.
* **Bound.** A micro-batch's *level* is max(floor, its heaviest bin's load plus the lightest samples
  that bin still needs): no completion can bring its top below it, so the sum of levels bounds the
  path. The samples left must also fit under the levels: an open bin can absorb at most the room
  under its level, and at most the heaviest samples left as many as it still needs; whatever does
  not fit raises some level, by at least the excess over the largest number of open bins in one
  micro-batch. A child whose bound reaches the best path known is cut.
* **Budget.** The search looks for a path strictly below ``incumbent``, tightens it with every plan it
  finds, stops at ``lower`` (a valid lower bound: nothing can be better), and places at most
  ``node_limit`` samples. The budget is a count, never a clock, so the answer is the same on every
  machine; ``proven`` says whether the search finished (the result is then optimal).
"""

from __future__ import annotations

from typing import NamedTuple

from mimo_pipes.balance.search.budget import BudgetSpent, filled_in_order, prefix_totals, runs_to_the_end


class WindowSearch(NamedTuple):
    bins: list[int] | None  # bin (m*G + g) of each sample, in sorted order; None if nothing better was found
    best: int  # critical path of ``bins`` (``incumbent`` if nothing better was found)
    proven: bool  # no plan has a lower critical path than ``best``
    nodes: int  # samples placed


def _room_of(load: list[int], fill: list[int], per_bin: int, first: int, last: int, top: int, most: list[int]) -> int:
    """What the open bins ``first`` .. ``last - 1`` (a micro-batch's) can still absorb under level ``top``
    (``most[n]``: the heaviest n samples left)."""
    room = 0
    for b in range(first, last):
        need = per_bin - fill[b]
        if need:
            under = top - load[b]
            room += under if under < most[need] else most[need]
    return room


def _rooms(load: list[int], fill: list[int], level: list[int], per_bin: int, num_slots: int, most: list[int]) -> list[int]:
    """:func:`_room_of` of every micro-batch under its level, in one pass over the bins."""
    rooms = []
    for m, top in enumerate(level):
        room = 0
        for b in range(m * num_slots, (m + 1) * num_slots):
            need = per_bin - fill[b]
            if need:
                under = top - load[b]
                room += under if under < most[need] else most[need]
        rooms.append(room)
    return rooms


def _children(tables: tuple, i: int, path: int, after: int, best: int, used: int) -> list[tuple[int, ...]]:
    """The bins sample i may go into, each as (bound, room left in its bin, bin, micro-batch, new level, new
    path), those whose bound is below ``best``, in the order they are tried. ``tables``: the search's costs,
    the heaviest samples left after each, bins and micro-batches as they stand, and shape; ``after``: the cost left once i is placed;
    ``used``: the micro-batches opened so far."""
    costs, tails, mosts, load, fill, level, opened, bin_of, per_bin, num_slots, count = tables
    cost = costs[i]
    width = per_bin + 1  # bin states (load, fill) as one int: load * width + fill
    most = mosts[i]
    rooms: list[int] = []  # filled when a child first needs them
    room = 0
    widest = max(opened)
    previous = bin_of[i - 1] if i and costs[i - 1] == cost else 0
    children = []
    for m in range(previous // num_slots, used + 1 if used < count else count):
        top = level[m]
        seen = set()
        first = m * num_slots
        for b in range(previous if previous > first else first, first + num_slots):
            filled = fill[b]
            if filled == per_bin:
                continue
            held = load[b]
            key = held * width + filled
            if key in seen:
                continue
            seen.add(key)
            new_load = held + cost
            new_top = new_load + tails[per_bin - filled - 1]
            if new_top < top:
                new_top = top
            new_path = path - top + new_top
            if new_path >= best:
                continue
            if not rooms:
                rooms = _rooms(load, fill, level, per_bin, num_slots, most)
                room = sum(rooms)
            if new_top == top:
                # Only bin b's share of the room changes.
                need = per_bin - filled
                under = top - held
                new_room = room - (under if under < most[need] else most[need])
                if need > 1:
                    under -= cost
                    new_room += under if under < most[need - 1] else most[need - 1]
            else:
                load[b], fill[b] = new_load, filled + 1
                new_room = room - rooms[m] + _room_of(load, fill, per_bin, first, first + num_slots, new_top, most)
                load[b], fill[b] = held, filled
            excess = after - new_room
            bound = new_path + (-(-excess // widest) if excess > 0 else 0)
            if bound < best:
                children.append((bound, new_top - new_load, b, m, new_top, new_path))
    children.sort()
    return children


def search_window(
    costs: list[int], count: int, num_slots: int, floor: int, incumbent: int, lower: int, node_limit: int
) -> WindowSearch:
    """Look for a plan of ``count`` micro-batches of ``num_slots`` bins whose critical path is below
    ``incumbent``. ``costs`` are plain ints sorted heaviest first; their number is a multiple of
    ``count * num_slots``."""
    size = len(costs)
    bins = count * num_slots
    per_bin = size // bins
    if incumbent <= lower or per_bin == 0:
        return WindowSearch(None, incumbent, True, 0)
    tails, heads = prefix_totals(costs, per_bin + 1)  # the n lightest samples' total; the i heaviest's
    load = [0] * bins
    fill = [0] * bins
    level = [max(floor, tails[per_bin])] * count
    opened = [num_slots] * count  # bins of each micro-batch with room left
    bin_of = [0] * size
    best = incumbent
    found: list[int] | None = None
    nodes = node_limit
    used = 0  # micro-batches opened so far (always a prefix)
    # The heaviest n samples left once sample i is placed (n up to a bin's size), for every i.
    mosts = [[heads[i + 1 + n] - heads[i + 1] for n in range(per_bin + 1)] for i in range(size)]
    tables = (costs, tails, mosts, load, fill, level, opened, bin_of, per_bin, num_slots, count)

    def place(i: int, path: int, rest: int) -> bool:
        """Place sample i and the ones after it; True once the lower bound is reached (stop)."""
        nonlocal best, found, nodes, used
        if i == size or costs[i] == 0:
            # Nothing left but zero costs: any completion keeps the loads, and the levels are the tops.
            if path < best:
                found = filled_in_order(bin_of, i, fill, per_bin)
                best = path
            return best <= lower
        cost = costs[i]
        after = rest - cost
        children = _children(tables, i, path, after, best, used)
        for bound, _, b, m, new_top, new_path in children:
            if bound >= best:
                break
            nodes -= 1
            if nodes < 0:
                raise BudgetSpent
            top, was_used = level[m], used
            load[b] += cost
            fill[b] += 1
            full = fill[b] == per_bin
            opened[m] -= full
            level[m] = new_top
            if m == used:
                used += 1
            bin_of[i] = b
            done = place(i + 1, new_path, after)
            load[b] -= cost
            fill[b] -= 1
            opened[m] += full
            level[m], used = top, was_used
            if done:
                return True
        return False

    proven = runs_to_the_end(lambda first: place(first, count * level[0], heads[size]))
    return WindowSearch(found, best, proven or best <= lower, node_limit - max(nodes, 0))
