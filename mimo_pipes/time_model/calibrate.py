"""Calibration of the time model: time a vision encoder over a sweep of image sizes and images per forward.

The encoder is any callable ``encoder(pixel_values, grid_thw)`` (a Qwen2-VL-style tower from
:mod:`mimo_pipes.demo_model.encoders`, or your own); the result is a :class:`~mimo_pipes.time_model.model.TimeModel` fit by
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

from mimo_pipes.time_model.fit import fit_error, fit_time_model, relative_errors
from mimo_pipes.time_model.model import TimeModel
from mimo_pipes.time_model.sweep import SWEEPS, Sweep, forward_shapes

# Told after every timed or warm-up run: (runs done, runs in all, estimated seconds left).
Progress = Callable[[int, int, float], None]


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


def seconds_left(last: Sequence[float | None], runs_left: Sequence[int], sizes: Sequence[float]) -> float:
    """Estimated seconds of the runs still to do: ``runs_left[i]`` runs of forward i, each at its last time,
    or, for a forward not run yet, at the seconds per unit of ``sizes`` (its patches) of those that ran.

    Rough until every forward ran once (a large image costs more than its patches' share), close after."""
    ran = [index for index, seconds in enumerate(last) if seconds is not None]
    ran_size = sum(sizes[index] for index in ran)
    rate = sum(last[index] for index in ran) / ran_size if ran_size > 0 else 0.0  # type: ignore[misc]
    return sum(runs * (seconds if seconds is not None else rate * size) for seconds, runs, size in zip(last, runs_left, sizes))


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
    progress: Progress | None = None,
) -> list[float]:
    """Median wall seconds of every forward (a list of ``[t, h, w]`` grids; random pixels of that shape).

    Every forward is first run ``warmup`` times (a GPU pays first-use costs per shape, and its clocks ramp
    up at the start), then timed once per round over ``repeats`` rounds, each round in its own seeded
    order: a slow spell of the machine (clocks, a busy host) then hits one round of many forwards
    rather than every repeat of one forward, and the median discards it. Inputs are made per call, so
    memory stays that of the largest forward. ``progress`` is told after every run (:data:`Progress`,
    the time left by :func:`seconds_left`)."""
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

    repeats = max(repeats, 1)
    sizes = [sum(t * h * w for t, h, w in forward) for forward in forwards]
    last: list[float | None] = [None] * len(forwards)
    runs_left = [warmup + repeats] * len(forwards)
    total = sum(runs_left)

    def run(index: int) -> float:
        seconds = once(index)
        last[index] = seconds
        runs_left[index] -= 1
        if progress is not None:
            progress(total - sum(runs_left), total, seconds_left(last, runs_left, sizes))
        return seconds

    times: list[list[float]] = [[] for _ in forwards]
    every = range(len(forwards))
    with torch.inference_mode():
        for _ in range(warmup):
            for index in every:
                run(index)
        if warmup:
            log(f"warmed up: {len(forwards)} forwards x {warmup}")
        order = list(every)
        rng = random.Random(seed)
        for number in range(1, repeats + 1):
            rng.shuffle(order)
            for index in order:
                times[index].append(run(index))
            log(f"round {number}/{repeats}: {len(forwards)} forwards timed")
    return [statistics.median(values) for values in times]


# Times forwards as :func:`time_in_rounds` does, with its arguments (another one can stand in for it).
Timer = Callable[..., list[float]]


def calibrate(
    encoder: Callable[[torch.Tensor, torch.Tensor], Any],
    *,
    patch_dim: int,
    merge_size: int,
    patch_size: int,
    temporal_patch_size: int,
    device: torch.device,
    dtype: torch.dtype,
    sweep: Sweep = SWEEPS["cuda"],
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: Progress | None = None,
    timer: Timer = time_in_rounds,
) -> tuple[TimeModel, list[Point], list[float]]:
    """Time the forwards of ``sweep`` (:func:`~mimo_pipes.time_model.sweep.forward_shapes`: the floor, the
    uniform shapes, the mixes), then fit.

    Timed by ``timer`` (:func:`time_in_rounds`: ``sweep.warmup`` untimed runs of every forward, then
    ``sweep.repeats`` shuffled rounds, median per forward). Returns the model, the points (the uniform
    shapes', then the mixes') and the modelled seconds of each point."""
    shapes = forward_shapes(sweep, merge_size, seed)
    grids = [[[1, side, side] for side in shape] for shape in shapes]
    medians = timer(encoder, grids, patch_dim=patch_dim, device=device, dtype=dtype, repeats=sweep.repeats,
                    warmup=sweep.warmup, seed=seed, log=log, progress=progress)
    floor = medians[0]
    log(f"floor (one image of {merge_size * merge_size} patches): {floor * 1e3:.2f} ms")
    points = [Point(shape, seconds) for shape, seconds in zip(shapes[1:], medians[1:])]
    model, fitted = fit_time_model(
        [(point.patches, point.seconds) for point in points], floor,
        merge_size=merge_size, patch_size=patch_size, temporal_patch_size=temporal_patch_size,
    )
    return model, points, fitted


def fit_report(model: TimeModel, points: Sequence[Point], fitted: Sequence[float]) -> list[str]:
    """The terms, the fit error of every point, and the worst and median error, as lines for people."""
    width = max([len("forward")] + [len(point.describe()) for point in points])
    lines = [
        f"floor {model.floor_ps / 1e9:.3f} ms; per image {model.per_image_ps / 1e9:.4f} ms, per patch "
        f"{model.per_patch_ps / 1e6:.4f} us, per patch^2 {model.per_patch_squared_ps / 1e3:.4f} ns",
        f"{'forward':>{width}} {'measured ms':>12} {'model ms':>10} {'error':>8}",
    ]
    measured = [point.seconds for point in points]
    for point, value, error in zip(points, fitted, relative_errors(measured, fitted)):
        lines.append(f"{point.describe():>{width}} {point.seconds * 1e3:>12.2f} {value * 1e3:>10.2f} {error:>+8.1%}")
    error = fit_error(measured, fitted)
    lines.append(f"fit error: worst {error.worst:+.1%} ({points[error.worst_index].describe()}), median {error.median:.1%}")
    return lines
