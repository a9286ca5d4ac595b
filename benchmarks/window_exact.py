"""Exact critical path of small windows (benchmark and test reference, not used by the library).

Samples may cross micro-batches. A plan is a partition of the window's W*B samples into W*G slots of
k = B/G samples; for given slot loads the best grouping into micro-batches sorts the slots heaviest
first and cuts them into runs of G, each micro-batch costing max(floor, its first slot). So the exact
optimum enumerates every partition into slots (all of them, vectorised with numpy), which is feasible
up to 16 samples.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

MAX_SAMPLES = 16


@functools.lru_cache(maxsize=8)
def partitions(size: int, per_slot: int) -> np.ndarray:
    """Every partition of range(size) into slots of ``per_slot``: int8 array (count, size/per_slot, per_slot)."""
    out: list[list[tuple[int, ...]]] = []

    def extend(rest: tuple[int, ...], slots: list[tuple[int, ...]]) -> None:
        if not rest:
            out.append(list(slots))
            return
        first, others = rest[0], rest[1:]
        for combo in _combinations(others, per_slot - 1):
            slots.append((first, *combo))
            extend(tuple(x for x in others if x not in combo), slots)
            slots.pop()

    extend(tuple(range(size)), [])
    return np.asarray(out, dtype=np.int8)


def _combinations(items: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.combinations(items, count))


def exact_window_path(costs: Sequence[Sequence[int]], num_slots: int, floor: int = 0) -> int:
    """The least critical path over every plan of the window (samples may cross micro-batches)."""
    flat = np.asarray([c for row in costs for c in row], dtype=np.int64)
    count = len(costs)
    size = flat.shape[0]
    if size > MAX_SAMPLES:
        raise ValueError(f"{size} samples: exact search only up to {MAX_SAMPLES}")
    per_slot = size // (count * num_slots)
    best = None
    table = partitions(size, per_slot)
    for chunk in range(0, table.shape[0], 200_000):
        loads = flat[table[chunk : chunk + 200_000].astype(np.int64)].sum(axis=2)
        loads = -np.sort(-loads, axis=1)
        path = np.maximum(loads[:, ::num_slots], floor).sum(axis=1).min()
        best = int(path) if best is None else min(best, int(path))
    return int(best)
