"""A vision encoder's time model: per-image terms from placeholder runs, and a per-forward floor.

Each image (or video) is one run of placeholder tokens in ``input_ids``; a run of n tokens stands for
n * merge_size**2 patches. A forward over a rank's images is modelled as

    max(floor, sum over images of (per_image + per_patch * p + per_patch_squared * p**2))

The floor is what a near-empty forward costs (kernel launches, weights streamed once): a rank pays it
whatever it holds, so it is a property of a forward, never of a sample. The sum is each image's
marginal cost; the quadratic term is attention within one image. All terms are integers in
picoseconds and a sample's cost is an integer number of nanoseconds, so every process on every module
computes the same costs and assignments. A file written by ``mimo-pipes calibrate`` holds the terms
(:func:`load_time_model`); without one the cost stays linear in image tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mimo_pipes.balance.validate import MAX_TOTAL_COST
from mimo_pipes.errors import ConfigError, as_count, json_error_text

FORMAT = "mimo-pipes-cost-model"
VERSION = 1
PS_PER_NS = 1000
TERMS = ("floor_ps", "per_image_ps", "per_patch_ps", "per_patch_squared_ps")
GEOMETRY = ("merge_size", "patch_size", "temporal_patch_size")
OPTIONAL = ("calibration",)  # what was measured, for people; never part of the fingerprint


class TimeModelError(ValueError):
    """A time-model file that cannot be used: names the file and the field at fault."""

    def __init__(self, path: str | Path | None, field: str | None, message: str) -> None:
        where = f"time model {path}" if path is not None else "time model"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")




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
            try:  # numpy and torch integers as ints; the ranges are worded below
                value = as_count(getattr(self, name), name, minimum=None)
            except ConfigError:
                raise TimeModelError(None, name, f"must be an integer, got {getattr(self, name)!r}") from None
            object.__setattr__(self, name, value)
            if value < 0:
                raise TimeModelError(None, name, f"must not be negative, got {value}")
            if value > MAX_TOTAL_COST:
                raise TimeModelError(None, name, f"{value} is beyond the int64 range the planners use (at most {MAX_TOTAL_COST})")
        for name in GEOMETRY:
            if getattr(self, name) < 1:
                raise TimeModelError(None, name, f"must be >= 1, got {getattr(self, name)}")
        if self.per_image_ps + self.per_patch_ps + self.per_patch_squared_ps == 0:
            raise TimeModelError(None, "per_patch_ps", "every per-image term is 0: the model would cost nothing")

    def image_time_ps(self, patches: int) -> int:
        """Marginal time of one image of ``patches`` patches."""
        return self.per_image_ps + self.per_patch_ps * patches + self.per_patch_squared_ps * patches * patches

    def encoder_time_ns(self, runs: Sequence[int]) -> int:
        """A sample's encoder cost: the marginal time of its images, from their placeholder runs."""
        merge = self.merge_size * self.merge_size
        return sum(self.image_time_ps(int(tokens) * merge) for tokens in runs) // PS_PER_NS

    def max_encoder_time_ns(self, tokens: int) -> int:
        """The largest :meth:`encoder_time_ns` of a sample with at most ``tokens`` placeholders: the image
        terms are convex in how the placeholders are split, so one image of all of them or one image per
        placeholder costs the most."""
        if tokens <= 0:
            return 0
        merge = self.merge_size * self.merge_size
        one = self.image_time_ps(tokens * merge)
        each = tokens * self.image_time_ps(merge)
        return max(one, each) // PS_PER_NS

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
                raise TimeModelError(path, name, f"{getattr(self, name)} in the file, but the processor uses {value}: calibrate again for this processor")


def save_time_model(model: TimeModel, path: str | Path, calibration: dict[str, Any] | None = None) -> Path:
    """Write the model as JSON (``calibration``: what was measured, kept for people to read)."""
    body: dict[str, Any] = model.terms()
    if calibration is not None:
        body["calibration"] = calibration
    path = Path(path)
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path


def load_time_model(path: str | Path) -> TimeModel:
    """Read a file written by :func:`save_time_model`; raise TimeModelError naming the file and field.

    A file is read once per process while it stays unchanged (same size and modification time): every
    check and graph of a run shares that one reading."""
    try:
        stat = Path(path).expanduser().stat()
        key = (str(Path(path).expanduser().resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _LOADED:
            _LOADED.clear()  # one model per run: keep the last only
            _LOADED[key] = _read_time_model(path)
        return _LOADED[key]
    except OSError as error:
        raise TimeModelError(path, None, f"cannot be read ({error.strerror or error})") from None


_LOADED: dict[tuple[str, int, int], TimeModel] = {}


def _read_time_model(path: str | Path) -> TimeModel:
    try:
        body = json.loads(Path(path).expanduser().read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise TimeModelError(path, None, f"is not JSON ({json_error_text(error) if isinstance(error, json.JSONDecodeError) else error})") from None
    if not isinstance(body, dict):
        raise TimeModelError(path, None, f"must hold a JSON object, got {type(body).__name__}")
    if body.get("format") != FORMAT:
        raise TimeModelError(path, "format", f"must be {FORMAT!r}, got {body.get('format')!r}: not a file written by mimo-pipes calibrate")
    if body.get("version") != VERSION:
        raise TimeModelError(path, "version", f"{body.get('version')!r} is not supported (this version reads {VERSION}): calibrate again")
    known = {"format", "version", *TERMS, *GEOMETRY, *OPTIONAL}
    unknown = sorted(set(body) - known)
    if unknown:
        raise TimeModelError(path, unknown[0], "unknown field")
    missing = [name for name in TERMS + GEOMETRY if name not in body]
    if missing:
        raise TimeModelError(path, missing[0], "missing")
    try:
        return TimeModel(**{name: body[name] for name in TERMS + GEOMETRY})
    except TimeModelError as error:
        raise TimeModelError(path, None, str(error).removeprefix("time model: ")) from None
