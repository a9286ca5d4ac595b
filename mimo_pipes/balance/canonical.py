"""Sorted ("rank space") working order and the canonical output order.

Every algorithm in this package works on the costs sorted by (-cost, index). Position p in that order
is the sample's *rank*; the engines see only the sorted cost values, so their decisions depend on the
multiset of costs and on ranks, never on hash order, floats or the machine. An assignment in rank space
is an int64 matrix ``members`` of shape (G, B/G): row = slot, entries = ranks.

Canonical output: each slot lists its sample indices in ascending order, and the slots are ordered by
their smallest index (equivalently, lexicographically, since slots are disjoint). For an empty
micro-batch every slot is empty.
"""

from __future__ import annotations

import numpy as np


def sort_order(costs: np.ndarray) -> np.ndarray:
    """Indices that sort ``costs`` by (-cost, index): heaviest first, ties by ascending index."""
    return np.argsort(-costs, kind="stable")


def slots_in_canonical_order(members: np.ndarray, order: np.ndarray, offset: int = 0) -> list[list[int]]:
    """Map a rank-space assignment back to sample indices (+ ``offset``) in canonical order."""
    if members.size == 0:
        return [[] for _ in range(members.shape[0])]
    indices = np.sort(order[members], axis=1) + offset
    rows = indices[np.argsort(indices[:, 0], kind="stable")]
    return rows.tolist()


def loads_of(sorted_costs: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Per-slot loads of a rank-space assignment."""
    if members.size == 0:
        return np.zeros(members.shape[0], dtype=np.int64)
    return sorted_costs[members].sum(axis=1)


def score(loads: np.ndarray) -> tuple[int, int]:
    """The objective, compared lexicographically: (heaviest load, heaviest minus lightest)."""
    if loads.size == 0:
        return (0, 0)
    top = int(loads.max())
    return (top, top - int(loads.min()))
