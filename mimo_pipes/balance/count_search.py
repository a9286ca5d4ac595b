"""Exact search over counts for windows of few distinct costs (text-only zeros, images on a few resolutions).

Samples of equal cost are interchangeable, so a bin (a slot of k = B/G samples) is a *type*: how many
samples of each of the d distinct costs it holds (C(d+k-1, k) types). A plan is a multiset of W*G types
that uses exactly the window's counts, and its path follows from the bin loads alone: sorted heaviest
first and cut into runs of G, micro-batch j costs max(floor, its first bin) (``bin_search`` says why).

* **Enumeration.** Types are ordered by load, heaviest first (ties by counts). Bins are chosen one at a
  time, each of the previous bin's type or a later one, so every multiset is made exactly once, as a
  non-increasing sequence of loads; a bin whose position is a multiple of G opens a micro-batch and adds
  max(floor, its load). A state is (remaining counts, first type allowed): the position follows from the
  counts, and what the remaining bins can add depends on nothing else, so states are memoised.
* **Bound.** Every later bin is at most the first allowed type's load (the *cap*), so the samples left must
  fit under it (the heaviest beside the lightest, the total, values some later type holds, samples above
  cap/2 with the light companions their bins need, bin packing's conflict weights). Each full run left has
  a head of at least the floor and at least a bin holding what the bins before the run cannot take: j
  samples of cost v or more, or conflicting ones; and the runs from there on hold what those bins (at most
  the cap each, at most the heaviest samples left) cannot absorb, so their heads, times G, cover it. Heads
  never rise along the runs, and a head above the floor is a load: a multiple of the costs' gcd.
* **Swaps.** A bin that could exchange a sample for a heavier one left and stay within what its
  micro-batch already costs (the floor; below the micro-batch's first bin, also the bin before it) is
  skipped: the exchange makes a later bin lighter, so the plan it gives is at least as good and its sorted
  loads are lexicographically larger; the optimal plan whose sorted loads are largest is never skipped.
* **Memo.** A state searched below a threshold without success stores the threshold it failed (a lower
  bound); a state that succeeded stores its exact value and the type it takes first. Every plan the
  search reaches is better than the best before it (a state's threshold is what the best plan known
  leaves it), so the last one reached is the search's answer.
* **Budget.** At most ``work_limit`` units of work: a state bounded costs ``STATE_WORK``, a type tried one
  (a count, never a clock; about 0.1 us a unit). The search looks strictly below ``incumbent`` and stops at
  ``lower``; ``proven`` says it finished, and its plan (or the incumbent it could not beat) is then
  optimal. Without a proof it still returns the best plan it reached; ``nodes`` is then the work spent.
"""

from __future__ import annotations

from itertools import combinations_with_replacement
from math import gcd

from mimo_pipes.balance.budget import BudgetSpent, runs_to_the_end
from mimo_pipes.balance.window_search import WindowSearch

_INFEASIBLE = 1 << 62
# A state's bound costs about as much as trying this many types (the work unit of the budget).
STATE_WORK = 64


class _Reached(Exception):
    """Raised when the search reaches a plan on the window's lower bound: nothing can be better."""


def bin_types(values: list[int], per_bin: int) -> list[tuple[int, tuple[int, ...]]]:
    """(load, count of each value) of every bin of ``per_bin`` samples, heaviest first (ties: more of the
    heavier values first). ``values`` are the distinct costs, heaviest first."""
    types = []
    for combo in combinations_with_replacement(range(len(values)), per_bin):
        counts = [0] * len(values)
        for v in combo:
            counts[v] += 1
        types.append((sum(values[v] for v in combo), tuple(counts)))
    types.sort(key=lambda item: (-item[0], [-c for c in item[1]]))
    return types


def count_types(distinct: int, per_bin: int) -> int:
    """How many bin types ``bin_types`` makes: C(d + k - 1, k)."""
    result = 1
    for i in range(per_bin):
        result = result * (distinct + i) // (i + 1)
    return result


def search_counts(
    costs: list[int], count: int, num_slots: int, floor: int, incumbent: int, lower: int, work_limit: int
) -> WindowSearch:
    """Look for a plan of ``count`` micro-batches of ``num_slots`` bins whose critical path is below
    ``incumbent``; ``costs`` are plain ints sorted heaviest first, their number a multiple of
    ``count * num_slots``. The result's ``bins`` number bins by micro-batch (m*G + g), as ``search_bins``."""
    size = len(costs)
    bins = count * num_slots
    per_bin = size // bins if bins else 0
    if incumbent <= lower or per_bin == 0:
        return WindowSearch(None, incumbent, True, 0)
    values = sorted(set(costs), reverse=True)
    distinct = len(values)
    start = [costs.count(v) for v in values]
    types = bin_types(values, per_bin)
    loads = [load for load, _ in types]
    # Loads are multiples of the costs' gcd: so is a head above the floor, and a sum of heads without a floor.
    step = gcd(*values) or 1
    heads_cost = [load if load > floor else floor for load in loads]
    parts = [[(v, c) for v, c in enumerate(counts) if c] for _, counts in types]  # a type's non-zero counts
    ntypes = len(types)
    # From type t on: the values some type holds (bit v), and the most samples of values[v] or more in one bin.
    supports = [0] * ntypes
    most_of = [[0] * distinct for _ in range(ntypes)]
    for u in range(ntypes - 1, -1, -1):
        above = 0
        for v in range(distinct):
            above += types[u][1][v]
            most_of[u][v] = max(above, most_of[u + 1][v]) if u + 1 < ntypes else above
        supports[u] = sum(1 << v for v, _ in parts[u]) | (supports[u + 1] if u + 1 < ntypes else 0)
    closest = min((a - b for a, b in zip(values, values[1:])), default=_INFEASIBLE)  # the least a swap raises a bin
    # Remaining counts as one int, a field of ``width`` bits per value whose top (guard) bit is set: taking a
    # type is one subtraction, and it fits exactly when every guard bit survives (no field borrowed).
    width = size.bit_length() + 1
    shifts = [v * width for v in range(distinct)]
    mask = (1 << (width - 1)) - 1
    guards = sum(1 << (shift + width - 1) for shift in shifts)
    codes = [sum(c << shifts[v] for v, c in enumerate(counts)) for _, counts in types]
    memo: dict[int, tuple[int, int]] = {}  # remaining * ntypes + first type allowed -> (value or bound, type or -1)
    taken: list[int] = []  # types of the bins chosen so far
    found: list[list[int]] = []  # the last plan reached (the best)
    work = work_limit

    def bound(t: int, rem: list[int], present: int, placed: int) -> int:
        """Lower bound on what the bins after ``placed`` add to the path, each of type ``t`` or later
        (``_INFEASIBLE`` if the samples left cannot fit under its load). ``present``: bit v set when samples
        of values[v] are left."""
        left = bins - placed
        cap = loads[t]
        lightest = 0
        heaviest = -1
        total = 0
        for v in range(distinct):
            n = rem[v]
            if n:
                total += n * values[v]
                lightest = values[v]
                if heaviest < 0:
                    heaviest = values[v]
        if heaviest + (per_bin - 1) * lightest > cap or total > left * cap or present & ~supports[t]:
            return _INFEASIBLE
        # Companions: samples above cap/2 have bins of their own, whose k-1 other places take samples of at
        # most cap - x each; the heaviest n such samples need (k-1)n of them (Hall's condition, nested sets).
        large = 0
        for v in range(distinct):
            if 2 * values[v] <= cap:
                break
            large += rem[v]
            if large:
                room_left = cap - values[v]
                companions = 0
                for w in range(distinct - 1, v, -1):
                    if values[w] > room_left:
                        break
                    companions += rem[w]
                if (per_bin - 1) * large > companions:
                    return _INFEASIBLE
        # Conflicts (as bin packing's L2 bound): for m <= cap/2, a sample above cap - m ("large", weight 2)
        # shares its bin with none of m or more; at most min(k, cap // m) samples of m or more ("medium",
        # weight 1) share one; so a bin weighs at most max(2, that).
        conflicts = []
        extra = (per_bin - 1) * lightest
        for m in values:
            if m == 0 or 2 * m > cap:
                continue
            weight = 0
            large = medium = _INFEASIBLE  # the lightest large and medium values left
            for v in range(distinct):
                if values[v] < m:
                    break
                if rem[v]:
                    if values[v] > cap - m:
                        weight += 2 * rem[v]
                        large = values[v]
                    else:
                        weight += rem[v]
                        medium = values[v]
            most = cap // m
            if most > per_bin:
                most = per_bin
            if most < 2:
                most = 2
            if weight > left * most:
                return _INFEASIBLE
            conflicts.append((weight, most, large, medium))
        open_bins = (-placed) % num_slots  # the rest of a run whose head is paid
        heads = (left - open_bins) // num_slots
        if heads == 0:
            return 0
        room = cap - per_bin * lightest  # under the cap, beside k of the lightest
        tops = []
        value = 0
        before = 0
        for i in range(heads):
            ahead = open_bins + i * num_slots
            later = (heads - i) * num_slots
            # Crowding: one of the ``later`` bins holds j of the samples of at least values[v] that the
            # ``ahead`` bins cannot take.
            top = floor
            at_least = 0
            for v in range(distinct):
                n = rem[v]
                if n == 0:
                    continue
                at_least += n
                fit = most_of[t][v]
                if values[v] != lightest and room // (values[v] - lightest) < fit:
                    fit = room // (values[v] - lightest)
                spill = at_least - ahead * fit
                if spill > 0:
                    j = -(-spill // later)
                    if j > per_bin:
                        return _INFEASIBLE
                    head = j * values[v] + (per_bin - j) * lightest
                    if head > top:
                        top = head
            # Conflicts: one of the ``later`` bins weighs at least q of what the ``ahead`` bins cannot hold:
            # a large sample (q <= 2) or q medium ones.
            for weight, most, large, medium in conflicts:
                spill = weight - ahead * most
                if spill > 0:
                    q = -(-spill // later)
                    head = large + extra if q <= 2 else _INFEASIBLE
                    if q <= per_bin and medium < _INFEASIBLE:
                        lowest = q * medium + (per_bin - q) * lightest
                        if lowest < head:
                            head = lowest
                    if head >= _INFEASIBLE:
                        return _INFEASIBLE
                    if head > top:
                        top = head
            # Averages: the runs from i on hold what the ``ahead`` bins cannot.
            most = 0
            places = ahead * per_bin
            for v in range(distinct):
                n = rem[v] if rem[v] < places else places
                most += n * values[v]
                places -= n
                if places == 0:
                    break
            held = ahead * cap
            rest = total - (held if held < most else most)
            if rest > 0:
                tail = -(-rest // num_slots)
                if not floor:
                    tail = -(-tail // step) * step
                if tail < (heads - i) * floor:
                    tail = (heads - i) * floor
                if before + tail > value:
                    value = before + tail
                level = -(-rest // later)  # run i's head is the heaviest bin from run i on
                level = -(-level // step) * step
                if level > top:
                    top = level
            tops.append(top)
            before += top
        for i in range(heads - 2, -1, -1):  # heads do not rise along the runs
            if tops[i] < tops[i + 1]:
                tops[i] = tops[i + 1]
        by_heads = sum(tops)
        return by_heads if by_heads > value else value

    def swaps_up(u: int, rem: list[int], present: int, limit: int) -> bool:
        """Whether a bin of type ``u`` could swap one of its samples for a heavier one left and stay within
        ``limit``, where its micro-batch's cost does not change: such a plan is never needed (the swap makes
        a later bin lighter, so a plan at least as good with heavier bins first exists, and is searched).
        ``present``: bit v set when samples of values[v] are left."""
        load = loads[u]
        if load + closest > limit:
            return False
        for v, c in parts[u]:
            if rem[v] == c:
                present &= ~(1 << v)  # the bin takes the last of them
        for v, _ in parts[u]:
            heavier = present & ((1 << v) - 1)
            if heavier and load + values[heavier.bit_length() - 1] - values[v] <= limit:
                return True  # the nearest heavier value left raises the bin least
        return False

    def completion(t: int, code: int, placed: int) -> list[int]:
        """The types a solved state takes, read off the memo."""
        chosen = []
        while placed < bins:
            t = memo[code * ntypes + t][1]
            chosen.append(t)
            code -= codes[t]
            placed += 1
        return chosen

    def record(plan: list[int]) -> None:
        """Keep a plan the search reached (better than any before it); stop once it meets ``lower``."""
        found[:] = [plan]
        if sum(heads_cost[u] for u in plan[::num_slots]) <= lower:
            raise _Reached

    def search(t: int, code: int, placed: int, budget: int) -> int:
        """The least the bins after ``placed`` can add: exact if below ``budget``, else a lower bound >= it."""
        nonlocal work
        if placed == bins:
            record(list(taken))
            return 0
        key = code * ntypes + t
        known = memo.get(key)
        if known is not None:
            if known[1] >= 0:  # solved: exact
                if known[0] < budget:
                    record(taken + completion(t, code, placed))
                return known[0]
            if known[0] >= budget:
                return known[0]
        work -= STATE_WORK
        if work < 0:
            raise BudgetSpent
        rem = [(code >> shift) & mask for shift in shifts]
        present = 0
        for v in range(distinct):
            if rem[v]:
                present |= 1 << v
        value = bound(t, rem, present, placed)
        if known is not None and known[0] > value:
            value = known[0]
        if value >= budget:
            memo[key] = (value, -1)
            return value
        work -= ntypes - t  # the types tried below
        head = placed % num_slots == 0
        # A bin may rise to ``limit`` at no cost: under the floor, and below a head under the bin before it.
        limit = floor if head else max(loads[t], floor)
        best, choice = _INFEASIBLE, -1
        for u in range(t, ntypes):
            cost = heads_cost[u] if head else 0
            if cost >= budget:
                if cost < best:
                    best = cost  # a lower bound through u: the head alone reaches the budget
                continue
            after = code - codes[u]
            if after & guards != guards or swaps_up(u, rem, present, limit):
                continue
            taken.append(u)
            below = search(u, after, placed + 1, budget - cost) + cost
            taken.pop()
            if below < budget:
                best, choice, budget = below, u, below
            elif below < best:
                best = below
        memo[key] = (best, choice)
        return best

    first = guards + sum(n << shift for n, shift in zip(start, shifts))
    try:
        done = runs_to_the_end(lambda _: search(0, first, 0, incumbent))
    except _Reached:
        done = True
    used = work_limit - max(work, 0)
    if not found:
        return WindowSearch(None, incumbent, done, used)
    plan = found[0]
    path = sum(heads_cost[u] for u in plan[::num_slots])
    # Bin b of the plan (b = m*G + g: runs of G are the micro-batches) takes the next samples of its values.
    next_of = []
    position = 0
    for n in start:
        next_of.append(position)
        position += n
    bin_of = [0] * size
    for b, u in enumerate(plan):
        for v, c in parts[u]:
            for _ in range(c):
                bin_of[next_of[v]] = b
                next_of[v] += 1
    return WindowSearch(bin_of, path, done, used)
