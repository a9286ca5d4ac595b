"""Fitting a time model to timed forwards: least squares with non-negative terms (floating point; the
model it returns is integers from then on)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mimo_pipes.time_model.model import TimeModel

# Points within this factor of the floor are left out of the fit of the per-image terms.
FLOOR_MARGIN = 1.15
# A fit whose worst point is off by more than this (as a fraction of the measured time) is refused by
# ``mimo-pipes calibrate`` unless it is given --accept-poor-fit. A good fit stays well inside it: the H200
# calibration of Qwen2-VL-675M in docs/benchmarks.md has its worst point at -40.6% (16 small images,
# launch-bound at the floor) and its median at 3.2%; the CPU fits that prompted the check were off by
# -63% to +343%.
POOR_FIT_THRESHOLD = 0.5


def fit_time_model(
    points: Sequence[tuple[Sequence[int], float]], floor_s: float, **geometry: int
) -> tuple[TimeModel, list[float]]:
    """Least squares with non-negative terms: ``points`` are (patches of each image, seconds of one forward).

    ``floor_s`` is the measured time of a near-empty forward. The per-image terms are fit on the points
    clearly above it (a forward at the floor says nothing about its images); every non-negative subset of
    (per_image, per_patch, per_patch_squared) is tried and the smallest residual kept. Returns the model and
    the modelled seconds of every point (``max(floor, sum)``)."""
    if not points:
        raise ValueError("no timings to fit")
    rows = np.array([[len(p), float(sum(p)), float(sum(x * x for x in p))] for p, _ in points], dtype=np.float64)
    times = np.array([t for _, t in points], dtype=np.float64)
    above = times > FLOOR_MARGIN * floor_s
    if above.sum() < 3:
        above = np.ones_like(above)
    design, target = rows[above], times[above]
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 8):
        columns = [j for j in range(3) if mask >> j & 1]
        scale = design[:, columns].max(axis=0)
        scale[scale == 0] = 1.0
        solution, *_ = np.linalg.lstsq(design[:, columns] / scale, target, rcond=None)
        if (solution < 0).any():
            continue
        coefficients = np.zeros(3)
        coefficients[columns] = solution / scale
        residual = float(np.square(design @ coefficients - target).sum())
        if best is None or residual < best[0]:
            best = (residual, coefficients)
    assert best is not None  # a single positive column always fits with a non-negative coefficient
    per_image, per_patch, per_patch_squared = (int(round(value * 1e12)) for value in best[1])
    if per_image + per_patch + per_patch_squared == 0:
        per_patch = 1  # every term rounded to 0 ps: keep the model usable (linear in patches)
    model = TimeModel(int(round(floor_s * 1e12)), per_image, per_patch, per_patch_squared, **geometry)
    floor_model = model.floor_ps / 1e12
    fitted = [max(floor_model, sum(model.image_time_ps(x) for x in p) / 1e12) for p, _ in points]
    return model, fitted



@dataclass(frozen=True)
class FitError:
    """Relative errors (modelled - measured) / measured of a fit's points: ``worst`` is the largest in size
    (signed: + is a model above the measurement), ``median`` the median size, ``worst_index`` its point."""

    worst: float
    median: float
    worst_index: int

    def is_poor(self, threshold: float = POOR_FIT_THRESHOLD) -> bool:
        return abs(self.worst) > threshold


def relative_errors(measured: Sequence[float], modelled: Sequence[float]) -> list[float]:
    """(modelled - measured) / measured of every point; 0 for a point measured at 0 s."""
    return [(model - seconds) / seconds if seconds > 0 else 0.0 for seconds, model in zip(measured, modelled)]


def fit_error(measured: Sequence[float], modelled: Sequence[float]) -> FitError:
    """The worst and median relative error of a fit (see :class:`FitError`)."""
    errors = relative_errors(measured, modelled)
    if not errors:
        raise ValueError("no points to measure the fit on")
    worst_index = max(range(len(errors)), key=lambda index: abs(errors[index]))
    return FitError(errors[worst_index], statistics.median(abs(error) for error in errors), worst_index)
