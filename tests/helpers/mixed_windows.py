"""Mixed text-and-image windows: the generator of the window planner's benchmark and tests.

A window is W micro-batches of B = G*k samples. 30-45% of the samples are text-only (cost 0); the others
carry image-token costs between about 60 and 1300, with repeats: drawn from a few realistic resolutions
(Qwen2-VL tokens of common image sizes), from a small pool of values of a continuous range, or both. Half
of the windows have a floor (the least a forward costs) between 0.5x and 1.1x the mean slot load.
"""

from __future__ import annotations

import numpy as np

# Image tokens (28-pixel merged patches) of common sizes: 224^2, 336^2, 384x512, 448^2, 480x640, 672^2,
# 512x1024, 896^2, 768x1024, 720x1280, 1008x1344 (capped).
RESOLUTIONS = (64, 144, 252, 256, 391, 576, 660, 1024, 1008, 1196, 1296)
LOW, HIGH = 60, 1300


def draw_window(
    rng: np.random.Generator, shape: tuple[int, int, int] | None = None
) -> tuple[list[list[int]], int, int, dict]:
    """(costs per micro-batch, G, floor, description) of one mixed window: W 2-6, G 4-16, k 1-3, or
    ``shape`` (W, G, k) when given."""
    count, slots, per_slot = int(rng.integers(2, 7)), int(rng.integers(4, 17)), int(rng.integers(1, 4))
    if shape is not None:
        count, slots, per_slot = shape
    size = slots * per_slot
    total = count * size
    text = float(rng.uniform(0.30, 0.45))
    kind = str(rng.choice(["resolutions", "continuous", "both"]))
    if kind == "resolutions":
        pool = rng.choice(RESOLUTIONS, size=int(rng.integers(3, 8)), replace=False)
    elif kind == "continuous":
        pool = rng.integers(LOW, HIGH + 1, size=max(2, int(total * rng.uniform(0.15, 0.6))))
    else:
        pool = np.concatenate((rng.choice(RESOLUTIONS, size=3, replace=False), rng.integers(LOW, HIGH + 1, size=6)))
    image = rng.choice(pool, size=total)
    zeros = int(round(text * total))
    costs = image.astype(np.int64)
    costs[rng.permutation(total)[:zeros]] = 0
    floor = 0
    if rng.random() < 0.5:
        floor = int(costs.sum() / (count * slots) * rng.uniform(0.5, 1.1))
    info = {"W": count, "G": slots, "k": per_slot, "text": round(zeros / total, 3), "kind": kind, "floor": floor}
    return costs.reshape(count, size).tolist(), slots, floor, info


def reported_window(rng: np.random.Generator) -> tuple[list[list[int]], int, int, dict]:
    """A window of the reported shape: 4 micro-batches of 16 samples over 8 slots, 35-45% text-only,
    image costs of ~60-1300 with repeats, no floor."""
    count, slots, size = 4, 8, 16
    total = count * size
    pool = rng.integers(LOW, HIGH + 1, size=int(rng.integers(8, 30)))
    costs = rng.choice(pool, size=total).astype(np.int64)
    costs[rng.permutation(total)[: int(round(rng.uniform(0.35, 0.45) * total))]] = 0
    info = {"W": count, "G": slots, "k": 2, "text": None, "kind": "reported", "floor": 0}
    return costs.reshape(count, size).tolist(), slots, 0, info


def path_of(flat: list[int], plan: list[list[list[int]]], floor: int) -> int:
    """Critical path of a plan (per micro-batch, per slot, flat indices)."""
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)
