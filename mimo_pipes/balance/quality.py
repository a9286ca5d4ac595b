"""Lower bounds and quality figures for micro-batch and window assignments.

Bounds (all provably valid; k = B/G samples per slot, c sorted heaviest first, c[0] the largest):

* average: ceil(sum(c) / G), since G slots share the total;
* pigeonhole: for t = 0 .. k-1, some slot holds t+1 of the tG+1 heaviest samples, hence at least the
  t+1 lightest of them, c[tG-t] + ... + c[tG], plus k-t-1 further samples, each at least as heavy as
  the lightest samples overall. t = 0 is "the heaviest sample plus the k-1 lightest".

Window bounds when samples may cross micro-batches (W micro-batches of B; critical path = sum over
micro-batches of their heaviest slot):

* average: ceil(sum of all costs / G), since each micro-batch's heaviest slot is at least its mean;
* largest samples: order the micro-batches by their heaviest sample; the m-th (from 0) holds a sample
  at least c[mB], because the mB+1 heaviest samples cannot fit into m micro-batches. Its heaviest slot
  also holds k-1 more samples, so the path is at least sum_m c[mB] + W * (sum of the k-1 lightest);
* heads and the rest, both at once: for any s = 0 .. W, the s micro-batches with the heaviest samples cost
  at least c[mB] + the k-1 lightest each (m < s), and the other W - s hold all but what those s hold, at
  most the sB heaviest samples, so together they cost at least ceil((total - sum of the sB heaviest) / G).
  s = 0 is the average, s = W the largest samples; in between it counts a very heavy sample once, in its own
  micro-batch, and the rest of the window at its mean (heavy-tailed costs: 6% tighter than both alone);
* stacked heavy samples: the qG+1 heaviest, each at least c[qG], lie in some t micro-batches; one holding h
  of them stacks ceil(h/G) of them in one slot, so those t cost at least max(t, q+1) * c[qG] together and the
  others at least their mean; the least over t (a hundred huge samples over 64 slots cost two forwards'
  worth of a huge sample however they are spread: 27% tighter there).

When samples stay in their micro-batch, the window bound is the sum of the per-micro-batch bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mimo_pipes.balance.validate import check_costs, check_window

_NONE = np.iinfo(np.int64).max
# Most elements of one block of the crowded-slot table (int64).
CROWDED_ELEMENTS = 1 << 16


def _crowded_bound(
    costs: np.ndarray, slots: int, heads: np.ndarray, tails: np.ndarray, max_extra: int | None
) -> int:
    """Crowded slots: of the G+j heaviest, M >= 1 slots hold two or more, together at least j+M of
    them (every other slot holds at most one), plus M*k - (j+M) further samples. Their mean load
    bounds the heaviest. For each j the bound is the smallest over every possible M
    (M <= j, M <= G, M*(k-1) >= j); the result is the largest over j (j <= ``max_extra`` if given:
    any subset of j gives a valid bound).
    """
    size = int(costs.shape[0])
    per_slot = size // slots
    extra = size - slots if max_extra is None else min(size - slots, max_extra)
    if extra < 1:
        return 0
    m = np.arange(1, slots + 1)[None, :]
    best = 0
    # The (j, M) table is built a block of j at a time: a few MiB whatever the number of slots.
    step = max(1, CROWDED_ELEMENTS // slots)
    for low in range(1, extra + 1, step):
        j = np.arange(low, min(low + step, extra + 1))[:, None]
        rest = m * (per_slot - 1) - j
        feasible = (m <= j) & (rest >= 0)
        numerator = heads[slots + j] - heads[slots - m] + tails[np.clip(rest, 0, size)]
        mean = -(-numerator // m)
        best = max(best, int(np.where(feasible, mean, _NONE).min(axis=1).max()))
    return best


def sorted_lower_bound(
    sorted_costs: np.ndarray, num_slots: int, thorough: bool = True, max_extra: int | None = None
) -> int:
    """:func:`lower_bound` for costs already sorted heaviest first (no validation).

    ``thorough=False`` skips the crowded-slot family (the costliest to evaluate); ``max_extra``
    limits it to the G + max_extra heaviest samples.
    """
    costs = np.asarray(sorted_costs, dtype=np.int64)
    size = int(costs.shape[0])
    if size == 0:
        return 0
    slots = num_slots
    per_slot = size // slots
    total = int(costs.sum())
    best = -(-total // slots)
    if per_slot == 1:
        return max(best, int(costs[0]))
    # heads[r]: sum of the r heaviest; tails[r]: sum of the r lightest.
    heads = np.concatenate(([0], np.cumsum(costs)))
    tails = np.concatenate(([0], np.cumsum(costs[::-1])))

    # Pigeonhole: some slot holds t+1 of the tG+1 heaviest.
    t = np.arange(per_slot)
    pigeon = heads[t * slots + 1] - heads[t * slots - t] + tails[per_slot - t - 1]
    best = max(best, int(pigeon.max()))

    if thorough:
        best = max(best, _crowded_bound(costs, slots, heads, tails, max_extra))

    # Partners: if the i+1 heaviest sit in i+1 different slots, those slots also hold (i+1)(k-1)
    # distinct other samples, the heaviest of which is at least the (i+1)(k-1)-th lightest, and whose
    # mean per slot is at least their share of the lightest; otherwise two of them share a slot.
    i = np.arange(min(slots, size))
    others = (i + 1) * (per_slot - 1)
    share = -(-tails[others] // (i + 1))
    largest_other = costs[size - others] + tails[per_slot - 2]
    apart = costs[i] + np.maximum(share, largest_other)
    together = np.where(
        i >= 1, costs[np.maximum(i - 1, 0)] + costs[i] + tails[per_slot - 2], _NONE
    )
    best = max(best, int(np.minimum(apart, together).max()))
    return best


def rows_lower_bound(sorted_rows: np.ndarray, num_slots: int) -> np.ndarray:
    """:func:`sorted_lower_bound` with ``thorough=False`` for many micro-batches at once: one bound per
    row of ``sorted_rows`` (n, B), each row sorted heaviest first (no validation). Same integers as the
    one-row function, in a few array operations instead of a few per row."""
    rows = np.asarray(sorted_rows, dtype=np.int64)
    count, size = rows.shape
    if size == 0:
        return np.zeros(count, dtype=np.int64)
    slots = num_slots
    per_slot = size // slots
    best = -(-rows.sum(axis=1) // slots)
    if per_slot == 1:
        return np.maximum(best, rows[:, 0])
    zero = np.zeros((count, 1), dtype=np.int64)
    heads = np.concatenate((zero, np.cumsum(rows, axis=1)), axis=1)
    tails = np.concatenate((zero, np.cumsum(rows[:, ::-1], axis=1)), axis=1)
    t = np.arange(per_slot)
    pigeon = heads[:, t * slots + 1] - heads[:, t * slots - t] + tails[:, per_slot - t - 1]
    best = np.maximum(best, pigeon.max(axis=1))
    i = np.arange(min(slots, size))
    others = (i + 1) * (per_slot - 1)
    share = -(-tails[:, others] // (i + 1))
    largest_other = rows[:, size - others] + tails[:, per_slot - 2][:, None]
    apart = rows[:, i] + np.maximum(share, largest_other)
    together = np.where(
        i >= 1,
        rows[:, np.maximum(i - 1, 0)] + rows[:, i] + tails[:, per_slot - 2][:, None],
        _NONE,
    )
    return np.maximum(best, np.minimum(apart, together).max(axis=1))


def lower_bound(costs: Sequence[int], num_slots: int) -> int:
    """A valid lower bound on the heaviest slot of any equal-count assignment of ``costs``."""
    array = check_costs(costs, num_slots)
    return sorted_lower_bound(np.sort(array)[::-1], num_slots)


def window_lower_bound(
    costs: Sequence[Sequence[int]], num_slots: int, across_microbatches: bool = True
) -> int:
    """A valid lower bound on the critical path (sum of per-micro-batch heaviest slots) of a window."""
    window = check_window(costs, num_slots)
    count, size = window.shape
    if num_slots == 1:  # one slot holds everything: the bound is the path (metrics of DP size 1, per window)
        return int(window.sum())
    if not across_microbatches:
        return sum(sorted_lower_bound(np.sort(row)[::-1], num_slots) for row in window)
    if size == 0:
        return 0
    return heads_and_rest_bound(np.sort(window.reshape(-1))[::-1], count, num_slots)


def heads_and_rest_bound(sorted_costs: np.ndarray, count: int, num_slots: int, floor: int = 0) -> int:
    """The window bound across micro-batches (module docstring: heads and the rest), with a ``floor`` per forward:
    the largest over s = 0 .. W of the s micro-batches with the heaviest samples at max(floor, c[mB] + the k-1
    lightest) each (m < s) plus the other W - s at max((W - s) * floor, ceil((total - the sB heaviest) / G))
    together (``sorted_costs`` heaviest first, W*B of them)."""
    costs = np.asarray(sorted_costs, dtype=np.int64)
    size = int(costs.shape[0])
    if size == 0:
        return count * floor
    microbatch, per_slot = size // count, size // (count * num_slots)
    lightest = int(costs[size - (per_slot - 1):].sum()) if per_slot > 1 else 0
    heads = np.concatenate(([0], np.cumsum(costs)))
    s = np.arange(count + 1)
    tops = np.concatenate(([0], np.cumsum(np.maximum(floor, costs[::microbatch][:count] + lightest))))
    rest = np.maximum((count - s) * floor, -(-(heads[-1] - heads[s * microbatch]) // num_slots))
    return max(int((tops + rest).max()), _stacked_bound(costs, count, num_slots, heads))


def _stacked_bound(costs: np.ndarray, count: int, num_slots: int, heads: np.ndarray) -> int:
    """Stacked heavy samples: the n = qG+1 heaviest, each at least v = c[qG], lie in some t micro-batches
    (ceil(n/B) <= t <= min(W, n)); one holding h of them has a slot with ceil(h/G) of them, so those t cost at
    least max(t, q+1) * v together, and the other W - t at least ceil((total - the tB heaviest) / G). The bound
    for n is the least over t; the result the largest over q < 2W + 1 (any subset of q is valid)."""
    size = int(costs.shape[0])
    microbatch = size // count
    q = np.arange(min(size // num_slots, 2 * count + 1))[:, None]
    n = q * num_slots + 1
    t = np.arange(1, count + 1)[None, :]
    value = np.maximum(t, q + 1) * costs[q * num_slots] + -(-(heads[-1] - heads[t * microbatch]) // num_slots)
    feasible = (t >= -(-n // microbatch)) & (t <= n)
    return int(np.where(feasible, value, _NONE).min(axis=1).max())


def window_path_bound(sorted_costs: np.ndarray, count: int, num_slots: int, floor: int = 0) -> int:
    """A lower bound on the critical path, sum over micro-batches of max(``floor``, heaviest slot), of
    any plan of a window whose W*B samples may cross micro-batches (``sorted_costs`` heaviest first).

    For any plan, regrouping its W*G slots heaviest first into runs of G does not raise the path, and
    then the j-th micro-batch costs the (jG+1)-th heaviest slot, which is at least
    * the heaviest slot of the lightest W*G - jG slots, so at least the engine's bound for the
      (W*G - jG)*k lightest samples over W*G - jG slots (lighter samples cannot make it heavier);
    * c[jB] plus the k-1 lightest: the jB+1 heaviest samples lie in j+1 micro-batches or more;
    and at least the floor. Summed over j, and never below :func:`window_lower_bound`'s terms."""
    costs = np.asarray(sorted_costs, dtype=np.int64)
    size = int(costs.shape[0])
    if size == 0:
        return count * floor
    bins = count * num_slots
    per_slot = size // bins
    microbatch = size // count
    lightest = int(costs[size - (per_slot - 1) :].sum()) if per_slot > 1 else 0
    total = 0
    for j in range(count):
        left = bins - j * num_slots
        light = sorted_lower_bound(costs[size - left * per_slot :], left, thorough=False)
        total += max(floor, light, int(costs[j * microbatch]) + lightest)
    return max(total, heads_and_rest_bound(costs, count, num_slots, floor))


def slot_loads(costs: Sequence[int], slots: Sequence[Sequence[int]]) -> list[int]:
    """Load (sum of costs) of each slot, in the order given."""
    return [int(sum(int(costs[i]) for i in slot)) for slot in slots]


def max_load(costs: Sequence[int], slots: Sequence[Sequence[int]]) -> int:
    """Heaviest slot load."""
    loads = slot_loads(costs, slots)
    return max(loads) if loads else 0


def spread(costs: Sequence[int], slots: Sequence[Sequence[int]]) -> int:
    """Heaviest minus lightest slot load."""
    loads = slot_loads(costs, slots)
    return max(loads) - min(loads) if loads else 0


def objective(costs: Sequence[int], slots: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(heaviest load, spread): the quantity balancing minimises, compared lexicographically."""
    loads = slot_loads(costs, slots)
    if not loads:
        return (0, 0)
    return (max(loads), max(loads) - min(loads))


def critical_path(
    costs: Sequence[Sequence[int]], microbatches: Sequence[Sequence[Sequence[int]]]
) -> int:
    """Sum over micro-batches of the heaviest slot; indices address the flattened window (m*B + j)."""
    flat = [int(c) for row in costs for c in row]
    return sum(max_load(flat, slots) for slots in microbatches)


def ratio_to_bound(value: int, bound: int) -> float:
    """value / bound for reporting (1.0 when both are 0). Never used in a decision."""
    if bound == 0:
        return 1.0 if value == 0 else float("inf")
    return value / bound
