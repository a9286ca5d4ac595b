"""A vision encoder's time model: per-image terms from placeholder runs, and a per-forward floor.

Each image (or video) is one run of placeholder tokens in ``input_ids``; a run of n tokens stands for
n * merge_size**2 patches. A forward over a rank's images is modelled as

    max(floor, sum over images of (per_image + per_patch * p + per_patch_squared * p**2))

The floor is what a near-empty forward costs (kernel launches, weights streamed once): a rank pays it
whatever it holds, so it is a property of a forward, never of a sample. The sum is each image's
marginal cost; the quadratic term is attention within one image. All terms are integers in
picoseconds and a sample's cost is an integer number of nanoseconds, so every process on every module
computes the same costs and assignments. A file written by ``mimo-pipes calibrate`` holds the terms
(:func:`load_cost_model`); without one the cost stays linear in image tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "mimo-pipes-cost-model"
VERSION = 1
PS_PER_NS = 1000
TERMS = ("floor_ps", "per_image_ps", "per_patch_ps", "per_patch_squared_ps")
GEOMETRY = ("merge_size", "patch_size", "temporal_patch_size")
OPTIONAL = ("calibration",)  # what was measured, for people; never part of the fingerprint
# Points within this factor of the floor are left out of the fit of the per-image terms.
FLOOR_MARGIN = 1.15


class CostModelError(ValueError):
    """A cost-model file that cannot be used: names the file and the field at fault."""

    def __init__(self, path: str | Path | None, field: str | None, message: str) -> None:
        where = f"cost model {path}" if path is not None else "cost model"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


# The calibration sweep's default grid: image sides in patches, and images per forward.
DEFAULT_SIDES = (8, 16, 32, 48, 64, 96, 128)
DEFAULT_COUNTS = (1, 4, 16, 64)
DEFAULT_MIXES = 12  # forwards of several image sizes at once


def placeholder_runs(input_ids: Any, placeholder_ids: int | Sequence[int]) -> list[int]:
    """Lengths of the maximal runs of one placeholder id in ``input_ids`` (tensor, array or list), in order.

    Each run is one image or video. Runs of different placeholder ids that touch are separate; a run cut
    off at the end of the sequence (truncated text) counts with the tokens that are there."""
    if hasattr(input_ids, "detach"):
        input_ids = input_ids.detach().cpu().numpy()
    ids = np.asarray(input_ids).reshape(-1)
    wanted = np.asarray([placeholder_ids] if isinstance(placeholder_ids, (int, np.integer)) else list(placeholder_ids))
    inside = np.isin(ids, wanted)
    if not inside.any():
        return []
    # A run starts where a placeholder follows a non-placeholder or a different placeholder.
    starts = inside & np.concatenate(([True], (ids[1:] != ids[:-1]) | ~inside[:-1]))
    begin = np.flatnonzero(starts)
    marks = np.cumsum(starts)[inside]  # run number of every placeholder token
    return np.bincount(marks - 1, minlength=begin.shape[0]).tolist()


@dataclass(frozen=True)
class TimeModel:
    """Integer terms of a vision encoder's forward time (picoseconds) and the image geometry it was fit for."""

    floor_ps: int = 0
    per_image_ps: int = 0
    per_patch_ps: int = 0
    per_patch_squared_ps: int = 0
    merge_size: int = 2
    patch_size: int = 14
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        for name in TERMS + GEOMETRY:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise CostModelError(None, name, f"must be an integer, got {value!r}")
            if value < 0:
                raise CostModelError(None, name, f"must not be negative, got {value}")
        for name in GEOMETRY:
            if getattr(self, name) < 1:
                raise CostModelError(None, name, f"must be >= 1, got {getattr(self, name)}")
        if self.per_image_ps + self.per_patch_ps + self.per_patch_squared_ps == 0:
            raise CostModelError(None, "per_patch_ps", "every per-image term is 0: the model would cost nothing")

    def image_time_ps(self, patches: int) -> int:
        """Marginal time of one image of ``patches`` patches."""
        return self.per_image_ps + self.per_patch_ps * patches + self.per_patch_squared_ps * patches * patches

    def encoder_time_ns(self, runs: Sequence[int]) -> int:
        """A sample's encoder cost: the marginal time of its images, from their placeholder runs."""
        merge = self.merge_size * self.merge_size
        return sum(self.image_time_ps(int(tokens) * merge) for tokens in runs) // PS_PER_NS

    @property
    def floor_ns(self) -> int:
        return self.floor_ps // PS_PER_NS

    def forward_time_ns(self, runs: Sequence[int]) -> int:
        """Modelled time of one forward over images with these placeholder runs (``max(floor, sum)``)."""
        return max(self.floor_ns, self.encoder_time_ns(runs))

    def terms(self) -> dict[str, int]:
        """What decides costs: the terms and geometry (the content of :meth:`fingerprint`)."""
        return {"format": FORMAT, "version": VERSION, **asdict(self)}  # type: ignore[dict-item]

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of :meth:`terms`: saved state made under another model is refused."""
        text = json.dumps(self.terms(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def check_geometry(self, path: str | Path | None, **processor: int) -> None:
        """Refuse a model fit for other patches than the processor makes (``merge_size=..``, ``patch_size=..``)."""
        for name, value in processor.items():
            if value is not None and getattr(self, name) != value:
                raise CostModelError(path, name, f"{getattr(self, name)} in the file, but the processor uses {value}: calibrate again for this processor")


def save_cost_model(model: TimeModel, path: str | Path, calibration: dict[str, Any] | None = None) -> Path:
    """Write the model as JSON (``calibration``: what was measured, kept for people to read)."""
    body: dict[str, Any] = model.terms()
    if calibration is not None:
        body["calibration"] = calibration
    path = Path(path)
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path


def load_cost_model(path: str | Path) -> TimeModel:
    """Read a file written by :func:`save_cost_model`; raise CostModelError naming the file and field."""
    try:
        body = json.loads(Path(path).read_text())
    except OSError as error:
        raise CostModelError(path, None, f"cannot be read ({error.strerror or error})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CostModelError(path, None, f"is not JSON ({error})") from None
    if not isinstance(body, dict):
        raise CostModelError(path, None, f"must hold a JSON object, got {type(body).__name__}")
    if body.get("format") != FORMAT:
        raise CostModelError(path, "format", f"must be {FORMAT!r}, got {body.get('format')!r}: not a file written by mimo-pipes calibrate")
    if body.get("version") != VERSION:
        raise CostModelError(path, "version", f"{body.get('version')!r} is not supported (this version reads {VERSION}): calibrate again")
    known = {"format", "version", *TERMS, *GEOMETRY, *OPTIONAL}
    unknown = sorted(set(body) - known)
    if unknown:
        raise CostModelError(path, unknown[0], "unknown field")
    missing = [name for name in TERMS + GEOMETRY if name not in body]
    if missing:
        raise CostModelError(path, missing[0], "missing")
    try:
        return TimeModel(**{name: body[name] for name in TERMS + GEOMETRY})
    except CostModelError as error:
        raise CostModelError(path, None, str(error).removeprefix("cost model: ")) from None


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

