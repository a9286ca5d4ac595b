"""Reference answers for the window searches' tests: every split tried, and the path of a plan's bins."""

from __future__ import annotations

import functools
import itertools


def every_path(costs: list[int], count: int, num_slots: int, floor: int) -> int:
    """The least critical path over every split of ``costs`` into ``count`` micro-batches of equal size, each
    split into ``num_slots`` bins of equal size: the sum over micro-batches of max(floor, heaviest bin).

    Exhaustive, with each set of samples solved once (samples as bits of a mask): the best path of the samples
    left does not depend on how the ones placed were grouped, nor the best heaviest bin of a micro-batch on
    the micro-batches around it. Every candidate group holds the lowest sample left, so each split is met once."""
    size = len(costs) // count
    per_bin = size // num_slots
    bits = [1 << i for i in range(len(costs))]

    def groups(mask: int, group_size: int):
        """Every subset of ``mask`` of ``group_size`` samples holding its lowest sample."""
        low = mask & -mask
        rest = [bit for bit in bits if mask & bit and bit != low]
        for partners in itertools.combinations(rest, group_size - 1):
            yield low + sum(partners)  # distinct bits: their sum is their union

    @functools.cache
    def load(mask: int) -> int:
        return sum(cost for cost, bit in zip(costs, bits) if mask & bit)

    @functools.cache
    def heaviest_bin(mask: int) -> int:
        if not mask:
            return 0
        return min(max(load(group), heaviest_bin(mask & ~group)) for group in groups(mask, per_bin))

    @functools.cache
    def path(mask: int) -> int:
        if not mask:
            return 0
        return min(max(floor, heaviest_bin(group)) + path(mask & ~group) for group in groups(mask, size))

    return path((1 << len(costs)) - 1)


def path_of_bins(costs: list[int], bins: list[int], count: int, num_slots: int, floor: int) -> int:
    """Critical path of bin numbers m*G + g per sample, checking each bin holds k samples."""
    per_bin = len(costs) // (count * num_slots)
    assert sorted(bins) == [b for b in range(count * num_slots) for _ in range(per_bin)]
    loads = [0] * (count * num_slots)
    for cost, b in zip(costs, bins):
        loads[b] += cost
    return sum(max(floor, max(loads[m * num_slots : (m + 1) * num_slots])) for m in range(count))


def assert_window_plan(plan: list[list[list[int]]], count: int, size: int, num_slots: int) -> None:
    """A window plan of ``count`` micro-batches of ``size`` samples over ``num_slots`` slots: every micro-batch
    has every slot, each slot holds ``size / num_slots`` samples, and every flat index appears once."""
    assert len(plan) == count
    assert all(len(slots) == num_slots and all(len(slot) == size // num_slots for slot in slots) for slots in plan)
    assert sorted(i for slots in plan for slot in slots for i in slot) == list(range(count * size))
