"""Fitting a time model to timed forwards: least squares with non-negative terms (floating point; the
model it returns is integers from then on)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mimo_pipes.time_model.model import TimeModel

# The calibration sweep's default grid: image sides in patches, and images per forward.
DEFAULT_SIDES = (8, 16, 32, 48, 64, 96, 128)
DEFAULT_COUNTS = (1, 4, 16, 64)
DEFAULT_MIXES = 12  # forwards of several image sizes at once
# Points within this factor of the floor are left out of the fit of the per-image terms.
FLOOR_MARGIN = 1.15


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

