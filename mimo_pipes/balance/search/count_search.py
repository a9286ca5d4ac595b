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

from mimo_pipes.balance.search.budget import BudgetSpent, runs_to_the_end
from mimo_pipes.balance.search.window_search import WindowSearch

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
    bins = count * num_slots
    per_bin = len(costs) // bins if bins else 0
    if incumbent <= lower or per_bin == 0:
        return WindowSearch(None, incumbent, True, 0)
    search = _CountSearch(costs, num_slots, bins, floor, lower, work_limit)
    try:
        done = runs_to_the_end(lambda _: search.search(0, search.first, 0, incumbent, search.start[:], search.everything))
    except _Reached:
        done = True
    used = work_limit - max(search.work, 0)
    if search.found is None:
        return WindowSearch(None, incumbent, done, used)
    return WindowSearch(search.samples_bins(search.found), search.path(search.found), done, used)


def _reach(types: list[tuple[int, tuple[int, ...]]], distinct: int) -> tuple[list[int], list[list[int]]]:
    """From type t on: the values some type holds (bit v of ``supports[t]``), and ``most_of[t][v]``, the most
    samples of values[v] or more in one bin."""
    ntypes = len(types)
    supports = [0] * ntypes
    most_of = [[0] * distinct for _ in range(ntypes)]
    for u in range(ntypes - 1, -1, -1):
        above = 0
        for v in range(distinct):
            above += types[u][1][v]
            most_of[u][v] = max(above, most_of[u + 1][v]) if u + 1 < ntypes else above
        supports[u] = sum(1 << v for v, c in enumerate(types[u][1]) if c) | (supports[u + 1] if u + 1 < ntypes else 0)
    return supports, most_of


class _CountSearch:
    """One search over counts: the window's tables, the memo, the plan being built and the budget left.

    Remaining counts are one int (the memo's key), a field of ``width`` bits per value whose top (guard) bit is
    set: taking a type is one subtraction, and it fits exactly when every guard bit survives (no field
    borrowed). The bounds read them as a list, which each bin chosen passes on to the next."""

    def __init__(self, costs: list[int], num_slots: int, bins: int, floor: int, lower: int, work_limit: int) -> None:
        size = len(costs)
        self.num_slots, self.bins, self.floor, self.lower = num_slots, bins, floor, lower
        self.per_bin = per_bin = size // bins
        self.values = values = sorted(set(costs), reverse=True)
        self.distinct = distinct = len(values)
        self.start = [costs.count(v) for v in values]
        types = bin_types(values, per_bin)
        self.loads = [load for load, _ in types]
        # Loads are multiples of the costs' gcd: so is a head above the floor, and a sum of heads without a floor.
        self.step = gcd(*values) or 1
        self.heads_cost = [load if load > floor else floor for load in self.loads]
        self.parts = [[(v, c) for v, c in enumerate(counts) if c] for _, counts in types]  # a type's non-zero counts
        self.ntypes = len(types)
        self.supports, self.most_of = _reach(types, distinct)
        # The least a swap raises a bin.
        self.closest = min((a - b for a, b in zip(values, values[1:])), default=_INFEASIBLE)
        width = size.bit_length() + 1
        self.shifts = shifts = [v * width for v in range(distinct)]
        self.guards = sum(1 << (shift + width - 1) for shift in shifts)
        self.codes = [sum(c << shifts[v] for v, c in enumerate(counts)) for _, counts in types]
        self.first = self.guards + sum(n << shift for n, shift in zip(self.start, shifts))
        self.everything = (1 << distinct) - 1  # every value has samples at the start
        self.memo: dict[int, tuple[int, int]] = {}  # remaining * ntypes + first type allowed -> (value or bound, type or -1)
        self.taken: list[int] = []  # types of the bins chosen so far
        self.found: list[int] | None = None  # the last plan reached (the best)
        self.work = work_limit
        self.conflict_kinds: dict[int, list[tuple[int, list[tuple[int, bool]]]]] = {}  # cap -> ``kinds_under``

    def search(self, t: int, code: int, placed: int, budget: int, rem: list[int], present: int) -> int:
        """The least the bins after ``placed`` can add: exact if below ``budget``, else a lower bound >= it.
        ``rem``: the counts ``code`` holds, one a value; ``present``: bit v set when samples of values[v] are left."""
        if placed == self.bins:
            self.record(list(self.taken))
            return 0
        key = code * self.ntypes + t
        known = self.memo.get(key)
        if known is not None:
            if known[1] >= 0:  # solved: exact
                if known[0] < budget:
                    self.record(self.taken + self.completion(t, code, placed))
                return known[0]
            if known[0] >= budget:
                return known[0]
        work = self.work = self.work - STATE_WORK
        if work < 0:
            raise BudgetSpent
        value = self.bound(t, rem, present, placed)
        if known is not None and known[0] > value:
            value = known[0]
        if value >= budget:
            self.memo[key] = (value, -1)
            return value
        self.memo[key] = best = self.branch(t, code, placed, budget, rem, present)
        return best[0]

    def branch(self, t: int, code: int, placed: int, budget: int, rem: list[int], present: int) -> tuple[int, int]:
        """(the least the bins after ``placed`` add, the type that reaches it or -1), trying each type from
        ``t`` on for the next bin; ``rem`` and ``present`` describe ``code``, as in :meth:`bound`."""
        ntypes, heads_cost, codes, guards, taken = self.ntypes, self.heads_cost, self.codes, self.guards, self.taken
        loads, closest, parts = self.loads, self.closest, self.parts
        self.work -= ntypes - t  # the types tried below
        head = placed % self.num_slots == 0
        # A bin may rise to ``limit`` at no cost: under the floor, and below a head under the bin before it.
        limit = self.floor if head else max(loads[t], self.floor)
        best, choice = _INFEASIBLE, -1
        for u in range(t, ntypes):
            cost = heads_cost[u] if head else 0
            if cost >= budget:
                if cost < best:
                    best = cost  # a lower bound through u: the head alone reaches the budget
                continue
            after = code - codes[u]
            if after & guards != guards:
                continue
            kept = present
            part = parts[u]
            for v, c in part:
                if rem[v] == c:
                    kept &= ~(1 << v)  # the bin takes the last of them
            if loads[u] + closest <= limit and self.swaps_up(u, kept, limit):  # (the check swaps_up starts with)
                continue
            left = rem[:]
            for v, c in part:
                left[v] -= c
            taken.append(u)
            below = self.search(u, after, placed + 1, budget - cost, left, kept) + cost
            taken.pop()
            if below < budget:
                best, choice, budget = below, u, below
            elif below < best:
                best = below
        return best, choice

    def bound(self, t: int, rem: list[int], present: int, placed: int) -> int:
        """Lower bound on what the bins after ``placed`` add to the path, each of type ``t`` or later
        (``_INFEASIBLE`` if the samples left cannot fit under its load). ``present``: bit v set when samples
        of values[v] are left."""
        values, per_bin = self.values, self.per_bin
        left = self.bins - placed
        cap = self.loads[t]
        lightest = 0
        heaviest = -1
        total = 0
        for v in range(self.distinct):
            n = rem[v]
            if n:
                total += n * values[v]
                lightest = values[v]
                if heaviest < 0:
                    heaviest = values[v]
        if heaviest + (per_bin - 1) * lightest > cap or total > left * cap or present & ~self.supports[t]:
            return _INFEASIBLE
        if 2 * heaviest > cap and self.companions_missing(cap, rem):  # (none above cap/2: none missing)
            return _INFEASIBLE
        conflicts = self.conflicts(cap, rem, left)
        if conflicts is None:
            return _INFEASIBLE
        open_bins = (-placed) % self.num_slots  # the rest of a run whose head is paid
        heads = (left - open_bins) // self.num_slots
        if heads == 0:
            return 0
        return self.heads_bound(t, rem, cap, lightest, total, conflicts, open_bins, heads)

    def companions_missing(self, cap: int, rem: list[int]) -> bool:
        """Samples above cap/2 have bins of their own, whose k-1 other places take samples of at most cap - x
        each; True when the heaviest n such samples lack the (k-1)n they need (Hall's condition, nested sets)."""
        values, distinct, per_bin = self.values, self.distinct, self.per_bin
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
                    return True
        return False

    def conflicts(self, cap: int, rem: list[int], left: int) -> list[tuple[int, int, int, int]] | None:
        """Conflicts (as bin packing's L2 bound): for m <= cap/2, a sample above cap - m ("large", weight 2)
        shares its bin with none of m or more; at most min(k, cap // m) samples of m or more ("medium", weight
        1) share one; so a bin weighs at most max(2, that). Per m: (weight left, most a bin weighs, the
        lightest large and medium values left); None when the ``left`` bins cannot hold the weight."""
        kinds = self.conflict_kinds.get(cap)
        if kinds is None:
            kinds = self.conflict_kinds[cap] = self.kinds_under(cap)
        values = self.values
        conflicts = []
        for most, members in kinds:
            weight = 0
            large = medium = _INFEASIBLE  # the lightest large and medium values left
            for v, is_large in members:
                n = rem[v]
                if n:
                    if is_large:
                        weight += 2 * n
                        large = values[v]
                    else:
                        weight += n
                        medium = values[v]
            if weight > left * most:
                return None
            conflicts.append((weight, most, large, medium))
        return conflicts

    def kinds_under(self, cap: int) -> list[tuple[int, list[tuple[int, bool]]]]:
        """For :meth:`conflicts` under ``cap``, per m (each value with 0 < 2m <= cap): (most a bin weighs, the
        values of m or more, each with whether it is large)."""
        values, per_bin = self.values, self.per_bin
        kinds = []
        for m in values:
            if m == 0 or 2 * m > cap:
                continue
            members = [(v, values[v] > cap - m) for v in range(self.distinct) if values[v] >= m]
            most = min(max(cap // m, 0), per_bin)
            kinds.append((max(most, 2), members))
        return kinds

    def heads_bound(
        self,
        t: int,
        rem: list[int],
        cap: int,
        lightest: int,
        total: int,
        conflicts: list[tuple[int, int, int, int]],
        open_bins: int,
        heads: int,
    ) -> int:
        """The bound of :meth:`bound` from the ``heads`` full runs left: each run's head is at least the
        floor, a bin crowded with what the bins before the run cannot take, a bin heavy with conflicts they
        cannot hold, and the average of what they cannot absorb; heads do not rise along the runs."""
        per_bin, num_slots, floor, step = self.per_bin, self.num_slots, self.floor, self.step
        extra = (per_bin - 1) * lightest
        crowd = self.crowding(t, rem, cap, lightest)
        held = self.held_ahead(rem, cap, open_bins, heads)
        tops = []
        value = 0
        before = 0
        for i in range(heads):
            ahead = open_bins + i * num_slots
            later = (heads - i) * num_slots
            # Crowding: one of the ``later`` bins holds j of the samples of at least values[v] that the
            # ``ahead`` bins cannot take.
            top = floor
            for cost, at_least, fit in crowd:
                spill = at_least - ahead * fit
                if spill > 0:
                    j = -(-spill // later)
                    if j > per_bin:
                        return _INFEASIBLE
                    head = j * cost + (per_bin - j) * lightest
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
            rest = total - held[i]
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

    def crowding(self, t: int, rem: list[int], cap: int, lightest: int) -> list[tuple[int, int, int]]:
        """For each value v left: (values[v], the samples of values[v] or more left, the most of them one bin
        of type ``t`` or later holds: at most ``most_of``, and within the cap beside the lightest)."""
        values, most_of = self.values, self.most_of[t]
        room = cap - self.per_bin * lightest  # under the cap, beside k of the lightest
        crowd = []
        at_least = 0
        for v in range(self.distinct):
            n = rem[v]
            if n == 0:
                continue
            at_least += n
            fit = most_of[v]
            if values[v] != lightest and room // (values[v] - lightest) < fit:
                fit = room // (values[v] - lightest)
            crowd.append((values[v], at_least, fit))
        return crowd

    def held_ahead(self, rem: list[int], cap: int, open_bins: int, heads: int) -> list[int]:
        """For each of the ``heads`` runs left, the most the bins before it (``open_bins`` + G per run) can
        hold of what is left: at most ``cap`` each, at most the heaviest samples left as many as their places."""
        values, distinct, per_bin, num_slots = self.values, self.distinct, self.per_bin, self.num_slots
        result = []
        for i in range(heads):
            ahead = open_bins + i * num_slots
            most = 0
            places = ahead * per_bin
            for v in range(distinct):
                n = rem[v] if rem[v] < places else places
                most += n * values[v]
                places -= n
                if places == 0:
                    break
            held = ahead * cap
            result.append(held if held < most else most)
        return result

    def swaps_up(self, u: int, present: int, limit: int) -> bool:
        """Whether a bin of type ``u`` could swap one of its samples for a heavier one left and stay within
        ``limit``, where its micro-batch's cost does not change: such a plan is never needed (the swap makes
        a later bin lighter, so a plan at least as good with heavier bins first exists, and is searched).
        ``present``: bit v set when samples of values[v] are left once the bin is taken."""
        load = self.loads[u]
        if load + self.closest > limit:
            return False
        parts, values = self.parts[u], self.values
        for v, _ in parts:
            heavier = present & ((1 << v) - 1)
            if heavier and load + values[heavier.bit_length() - 1] - values[v] <= limit:
                return True  # the nearest heavier value left raises the bin least
        return False

    def completion(self, t: int, code: int, placed: int) -> list[int]:
        """The types a solved state takes, read off the memo."""
        chosen = []
        while placed < self.bins:
            t = self.memo[code * self.ntypes + t][1]
            chosen.append(t)
            code -= self.codes[t]
            placed += 1
        return chosen

    def record(self, plan: list[int]) -> None:
        """Keep a plan the search reached (better than any before it); stop once it meets ``lower``."""
        self.found = plan
        if self.path(plan) <= self.lower:
            raise _Reached

    def path(self, plan: list[int]) -> int:
        """The critical path of a plan: its bins' types, runs of G the micro-batches, heaviest first."""
        return sum(self.heads_cost[u] for u in plan[:: self.num_slots])

    def samples_bins(self, plan: list[int]) -> list[int]:
        """Bin b of the plan (b = m*G + g: runs of G are the micro-batches) of each sample in sorted order:
        each bin takes the next samples of its values."""
        next_of = []
        position = 0
        for n in self.start:
            next_of.append(position)
            position += n
        bin_of = [0] * position
        for b, u in enumerate(plan):
            for v, c in self.parts[u]:
                for _ in range(c):
                    bin_of[next_of[v]] = b
                    next_of[v] += 1
        return bin_of
