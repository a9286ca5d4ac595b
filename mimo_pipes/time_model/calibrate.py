"""Calibration of the time model: time a vision encoder over a sweep of image sizes and images per forward.

The encoder is any callable ``encoder(pixel_values, grid_thw)`` (a Qwen2-VL-style tower from
:mod:`mimo_pipes.encoders`, or your own); the result is a :class:`~mimo_pipes.time_model.model.TimeModel` fit by
:func:`~mimo_pipes.time_model.fit.fit_time_model`. Nothing here decides an assignment: the fit is floating
point, and the saved model is integers from then on.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mimo_pipes.time_model.fit import DEFAULT_COUNTS, DEFAULT_MIXES, DEFAULT_SIDES, fit_time_model
from mimo_pipes.time_model.model import TimeModel

# Image sides in patches (multiples of the merge size), and images per forward. The largest forward is
# capped (MAX_PATCHES_PER_FORWARD) so the sweep fits in memory on any GPU that can train the tower.
MAX_PATCHES_PER_FORWARD = 65_536


@dataclass(frozen=True)
class Point:
    """One timed forward: images of ``sides`` x ``sides`` patches (one side per image); median seconds."""

    sides: tuple[int, ...]
    seconds: float

    @property
    def patches(self) -> list[int]:
        return [side * side for side in self.sides]

    @property
    def count(self) -> int:
        return len(self.sides)

    def describe(self) -> str:
        if len(set(self.sides)) == 1:
            return f"{self.count} x {self.sides[0] ** 2} patches"
        return f"{self.count} images, {'+'.join(str(p) for p in self.patches)} patches"


def sweep(sides: Sequence[int], counts: Sequence[int], merge_size: int, max_patches: int = MAX_PATCHES_PER_FORWARD) -> list[tuple[int, int]]:
    """(side, count) shapes of the sweep: sides rounded up to the merge size, forwards above ``max_patches`` left out."""
    shapes = []
    for side in sides:
        side = -(-int(side) // merge_size) * merge_size
        for count in counts:
            if side * side * count <= max_patches and (side, count) not in shapes:
                shapes.append((side, int(count)))
    if not shapes:
        raise ValueError(f"no forward of the sweep fits in {max_patches} patches")
    return shapes


def mixed_shapes(sides: Sequence[int], merge_size: int, number: int, seed: int = 0, max_images: int = 8,
                 max_patches: int = MAX_PATCHES_PER_FORWARD) -> list[tuple[int, ...]]:
    """``number`` forwards of 2..``max_images`` images of different sides drawn from ``sides`` (seeded).

    Real forwards mix sizes; the uniform sweep alone leaves the fit blind to how a small image beside a
    large one costs."""
    rounded = sorted({-(-int(side) // merge_size) * merge_size for side in sides})
    if len(rounded) < 2 or number <= 0:
        return []
    rng = random.Random(seed)
    shapes: list[tuple[int, ...]] = []
    for _ in range(100 * number):
        if len(shapes) == number:
            break
        chosen = tuple(sorted((rng.choice(rounded) for _ in range(rng.randint(2, max_images))), reverse=True))
        if len(set(chosen)) > 1 and sum(s * s for s in chosen) <= max_patches and chosen not in shapes:
            shapes.append(chosen)
    return shapes


def time_in_rounds(
    encoder: Callable[[torch.Tensor, torch.Tensor], Any],
    forwards: Sequence[Sequence[Sequence[int]]],
    *,
    patch_dim: int,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    warmup: int,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[float]:
    """Median wall seconds of every forward (a list of ``[t, h, w]`` grids; random pixels of that shape).

    Every forward is first run ``warmup`` times (a GPU pays first-use costs per shape, and its clocks ramp
    up at the start), then timed once per round over ``repeats`` rounds, each round in its own seeded
    order: a slow spell of the machine (clocks, a busy host) then hits one round of many forwards
    rather than every repeat of one forward, and the median discards it. Inputs are made per call, so
    memory stays that of the largest forward."""
    def once(index: int) -> float:
        grid = torch.tensor(forwards[index], dtype=torch.int64).reshape(-1, 3).to(device)
        pixels = torch.randn(int(grid.prod(dim=1).sum()), patch_dim, device=device, dtype=dtype)
        collecting = gc.isenabled()
        gc.disable()  # a collection during the forward would be charged to the encoder
        try:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            encoder(pixels, grid)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - start
        finally:
            if collecting:
                gc.enable()

    times: list[list[float]] = [[] for _ in forwards]
    every = range(len(forwards))
    with torch.inference_mode():
        for _ in range(warmup):
            for index in every:
                once(index)
        if warmup:
            log(f"warmed up: {len(forwards)} forwards x {warmup}")
        order = list(every)
        rng = random.Random(seed)
        for number in range(1, max(repeats, 1) + 1):
            rng.shuffle(order)
            for index in order:
                times[index].append(once(index))
            log(f"round {number}/{max(repeats, 1)}: {len(forwards)} forwards timed")
    return [statistics.median(values) for values in times]


def calibrate(
    encoder: Callable[[torch.Tensor, torch.Tensor], Any],
    *,
    patch_dim: int,
    merge_size: int,
    patch_size: int,
    temporal_patch_size: int,
    device: torch.device,
    dtype: torch.dtype,
    sides: Sequence[int] = DEFAULT_SIDES,
    counts: Sequence[int] = DEFAULT_COUNTS,
    mixes: int = DEFAULT_MIXES,
    repeats: int = 5,
    warmup: int = 2,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> tuple[TimeModel, list[Point], list[float]]:
    """Time the floor (one image of merge x merge patches), every shape of the sweep and ``mixes`` mixed forwards, then fit.

    Timed by :func:`time_in_rounds` (``warmup`` untimed runs of every shape, then ``repeats`` shuffled
    rounds, median per shape). Returns the model, the points (the sweep's, then the mixes) and the modelled seconds of each point."""
    shapes: list[tuple[int, ...]] = [(merge_size,)]
    shapes += [(side,) * count for side, count in sweep(sides, counts, merge_size)]
    shapes += mixed_shapes(sides, merge_size, mixes, seed)
    grids = [[[1, side, side] for side in shape] for shape in shapes]
    medians = time_in_rounds(encoder, grids, patch_dim=patch_dim, device=device, dtype=dtype, repeats=repeats,
                             warmup=warmup, seed=seed, log=log)
    floor = medians[0]
    log(f"floor (one image of {merge_size * merge_size} patches): {floor * 1e3:.2f} ms")
    points = [Point(shape, seconds) for shape, seconds in zip(shapes[1:], medians[1:])]
    model, fitted = fit_time_model(
        [(point.patches, point.seconds) for point in points], floor,
        merge_size=merge_size, patch_size=patch_size, temporal_patch_size=temporal_patch_size,
    )
    return model, points, fitted


def fit_report(model: TimeModel, points: Sequence[Point], fitted: Sequence[float]) -> list[str]:
    """The terms and the fit error of every point, as lines for people."""
    width = max([len("forward")] + [len(point.describe()) for point in points])
    lines = [
        f"floor {model.floor_ps / 1e9:.3f} ms; per image {model.per_image_ps / 1e9:.4f} ms, per patch "
        f"{model.per_patch_ps / 1e6:.4f} us, per patch^2 {model.per_patch_squared_ps / 1e3:.4f} ns",
        f"{'forward':>{width}} {'measured ms':>12} {'model ms':>10} {'error':>8}",
    ]
    for point, value in zip(points, fitted):
        error = (value - point.seconds) / point.seconds if point.seconds > 0 else 0.0
        lines.append(f"{point.describe():>{width}} {point.seconds * 1e3:>12.2f} {value * 1e3:>10.2f} {error:>+8.1%}")
    return lines
