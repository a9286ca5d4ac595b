"""Reference answers for the window searches' tests: every split tried, and the path of a plan's bins."""

from __future__ import annotations

import itertools


def every_path(costs: list[int], count: int, num_slots: int, floor: int) -> int:
    """The least critical path over every split of ``costs`` into count * num_slots bins of equal size:
    bins heaviest first, cut into runs of num_slots (the best grouping for given bin loads)."""
    per_bin = len(costs) // (count * num_slots)
    best = None

    def split(rest: tuple[int, ...], loads: list[int]) -> None:
        nonlocal best
        if not rest:
            tops = sorted(loads, reverse=True)[::num_slots]
            path = sum(max(floor, top) for top in tops)
            best = path if best is None else min(best, path)
            return
        first, others = rest[0], rest[1:]
        for partners in itertools.combinations(range(len(others)), per_bin - 1):
            chosen = set(partners)
            load = costs[first] + sum(costs[others[p]] for p in partners)
            split(tuple(x for p, x in enumerate(others) if p not in chosen), loads + [load])

    split(tuple(range(len(costs))), [])
    assert best is not None
    return best


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
