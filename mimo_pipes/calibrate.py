"""Calibration of the time model: time a vision encoder over a sweep of image sizes and images per forward.

The encoder is any callable ``encoder(pixel_values, grid_thw)`` (a Qwen2-VL-style tower from
:mod:`mimo_pipes.encoders`, or your own); the result is a :class:`~mimo_pipes.cost_model.TimeModel` fit by
:func:`~mimo_pipes.cost_model.fit_time_model`. Nothing here decides an assignment: the fit is floating
point, and the saved model is integers from then on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mimo_pipes.cost_model import DEFAULT_COUNTS, DEFAULT_SIDES, TimeModel, fit_time_model

# Image sides in patches (multiples of the merge size), and images per forward. The largest forward is
# capped (MAX_PATCHES_PER_FORWARD) so the sweep fits in memory on any GPU that can train the tower.
MAX_PATCHES_PER_FORWARD = 65_536


@dataclass(frozen=True)
class Point:
    """One timed forward shape: ``count`` images of ``side`` x ``side`` patches; median seconds."""

    side: int
    count: int
    seconds: float

    @property
    def patches(self) -> list[int]:
        return [self.side * self.side] * self.count


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


def time_forward(encoder: Callable[[torch.Tensor, torch.Tensor], Any], pixel_values: torch.Tensor, grid: torch.Tensor,
                 device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall seconds of ``encoder(pixel_values, grid)`` (synchronised on CUDA)."""
    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        encoder(pixel_values, grid)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    with torch.inference_mode():
        for _ in range(warmup):
            once()
        return statistics.median(once() for _ in range(max(repeats, 1)))


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
    repeats: int = 5,
    warmup: int = 2,
    log: Callable[[str], None] = print,
) -> tuple[TimeModel, list[Point], list[float]]:
    """Time the floor (one image of merge x merge patches) and every shape of the sweep, then fit.

    Returns the model, the points and the modelled seconds of each point."""
    def measure(side: int, count: int) -> float:
        grid = torch.tensor([[1, side, side]] * count, dtype=torch.int64)
        pixels = torch.randn(side * side * count, patch_dim, device=device, dtype=dtype)
        return time_forward(encoder, pixels, grid.to(device), device, repeats, warmup)

    floor = measure(merge_size, 1)
    log(f"floor (one image of {merge_size * merge_size} patches): {floor * 1e3:.2f} ms")
    points = []
    shapes = sweep(sides, counts, merge_size)
    for number, (side, count) in enumerate(shapes, start=1):
        points.append(Point(side, count, measure(side, count)))
        log(f"[{number}/{len(shapes)}] {count} x {side * side} patches: {points[-1].seconds * 1e3:.2f} ms")
    model, fitted = fit_time_model(
        [(point.patches, point.seconds) for point in points], floor,
        merge_size=merge_size, patch_size=patch_size, temporal_patch_size=temporal_patch_size,
    )
    return model, points, fitted


def fit_report(model: TimeModel, points: Sequence[Point], fitted: Sequence[float]) -> list[str]:
    """The terms and the fit error of every point, as lines for people."""
    lines = [
        f"floor {model.floor_ps / 1e9:.3f} ms; per image {model.per_image_ps / 1e9:.4f} ms, per patch "
        f"{model.per_patch_ps / 1e6:.4f} us, per patch^2 {model.per_patch_squared_ps / 1e3:.4f} ns",
        f"{'images':>6} {'patches each':>12} {'measured ms':>12} {'model ms':>10} {'error':>8}",
    ]
    for point, value in zip(points, fitted):
        error = (value - point.seconds) / point.seconds if point.seconds > 0 else 0.0
        lines.append(f"{point.count:>6} {point.side * point.side:>12} {point.seconds * 1e3:>12.2f} {value * 1e3:>10.2f} {error:>+8.1%}")
    return lines
