"""Compositions (which samples form each micro-batch) that the window planner ranks, and the bound that ranks
them without balancing them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mimo_pipes.balance.quality import rows_lower_bound
from mimo_pipes.balance.window.tuning import WindowTuning


def compositions(order: np.ndarray, count: int, num_slots: int, floor: int, tuning: WindowTuning) -> Iterator[np.ndarray]:
    """Ways to choose which samples form each micro-batch: (W, B) flat indices each, every row in sorted
    order, in the order of preference on ties (the window as it stands is the caller's, before these).

    ``runs`` gives micro-batch m the m-th run of B sorted samples (like samples together: right without a
    floor). ``snake`` cuts the sorted samples into chunks of G (one sample per slot) and deals them to the
    micro-batches back and forth, so every micro-batch gets heavy and light samples, none sits below the
    floor, and a heavy chunk's samples can each have a slot of their own. With a floor, hybrids keep the
    h heaviest runs and deal the rest. Runs with f fillers (f a power of two or a multiple of G below B)
    complete each run of B - f with the f lightest samples left. Their number grows with W and B/G, so
    they are made one at a time: a caller that scores each and keeps the best holds a few windows' worth
    of memory, never all of them at once."""
    size = order.shape[0] // count
    runs = order.reshape(count, size)
    yield runs
    yield snake(order, count, num_slots)
    if floor and size > num_slots:
        for heads in thinned(list(range(1, count - 1)), tuning):
            yield np.concatenate((runs[:heads], snake(order[heads * size :], count - heads, num_slots)))
    if count > 1 and size > num_slots:
        for fillers in filler_counts(size, num_slots, tuning):
            yield with_fillers(order, count, size, fillers)


def filler_counts(size: int, num_slots: int, tuning: WindowTuning) -> list[int]:
    """The numbers of fillers tried: powers of two and multiples of G below B, ascending (thinned)."""
    powers = {1 << i for i in range(size.bit_length()) if 1 << i < size}
    return thinned(sorted(powers | set(range(num_slots, size, num_slots))), tuning)


def thinned(values: list[int], tuning: WindowTuning) -> list[int]:
    """``values`` (ascending, positive) when there are at most ``compositions_dense`` of them; else the first
    ``compositions_dense``, then each value at least 1/``compositions_growth`` above the last kept, and the
    last."""
    dense, growth = tuning.compositions_dense, tuning.compositions_growth
    if len(values) <= dense:
        return values
    kept = values[:dense]
    for value in values[dense:-1]:
        if value * growth >= kept[-1] * (growth + 1):
            kept.append(value)
    kept.append(values[-1])
    return kept


def with_fillers(order: np.ndarray, count: int, size: int, fillers: int) -> np.ndarray:
    """Sorted runs of B - ``fillers`` samples, each completed with the ``fillers`` lightest samples left
    (the first run with the lightest of all); the last micro-batch takes the middle. A run that holds a
    few very heavy samples can then give each a slot of light ones under its top: (W, B) flat indices."""
    total = count * size
    heavy = size - fillers
    m = np.arange(count, dtype=np.int64)[:, None]
    j = np.arange(size, dtype=np.int64)[None, :]
    # Positions in the sorted order: the m-th heavy run, then the m-th group of fillers from the end.
    positions = np.where(j < heavy, m * heavy + j, total - (m + 1) * fillers + (j - heavy))
    positions[-1] = (count - 1) * heavy + j[0]
    return order[positions]


def snake(order: np.ndarray, count: int, num_slots: int) -> np.ndarray:
    """Chunks of G sorted samples dealt to ``count`` micro-batches back and forth: (count, B) flat indices."""
    chunks = order.reshape(-1, count, num_slots).copy()
    chunks[1::2] = chunks[1::2, ::-1]
    return chunks.transpose(1, 0, 2).reshape(count, -1)


def estimate(sorted_rows: np.ndarray, num_slots: int, floor: int) -> int:
    """Lower bound on the critical path of a composition (W, B), rows sorted heaviest first: each
    balanced micro-batch costs at least max(floor, its lower bound). Balanced by the engine they come
    close to it, so it ranks compositions without balancing them."""
    return int(np.maximum(rows_lower_bound(sorted_rows, num_slots), floor).sum())
