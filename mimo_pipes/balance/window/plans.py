"""A window's plan as the planner holds it: per micro-batch, a (G, k) matrix of flat window indices (m*B + j);
its critical path, and its canonical output."""

from __future__ import annotations

import numpy as np


def canonical_microbatch(indices: np.ndarray) -> list[list[int]]:
    """(G, k) flat indices -> canonical list of slots: each slot ascending, slots by their smallest index."""
    if indices.size == 0:
        return [[] for _ in range(indices.shape[0])]
    rows = np.sort(indices, axis=1)
    return rows[np.argsort(rows[:, 0], kind="stable")].tolist()


def loads_path(loads: np.ndarray, floor: int) -> int:
    """Critical path of (W, G) slot loads: every forward costs at least ``floor``."""
    if loads.size == 0:
        return 0
    return int(np.maximum(loads.max(axis=1), floor).sum())


def plan_path(flat: np.ndarray, plan: list[np.ndarray], floor: int) -> int:
    """Critical path of a plan: per-micro-batch (G, k) flat indices."""
    return loads_path(np.stack([flat[rows].sum(axis=1) for rows in plan]), floor)
