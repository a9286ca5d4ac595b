"""Decoding a row's images and videos: paths (relative to an image folder), bytes, ``datasets.Image``
values, PIL images or arrays. Every failure is a :class:`SampleError` naming the dataset row."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from mimo_pipes.errors import SampleError


def as_list(value: Any) -> list:
    """``None`` -> ``[]``; a list or tuple as a list; anything else as a one-item list."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def open_image(item: Any, image_folder: str | None, row: object, what: str):
    """One image as a loaded RGB-or-gray PIL image."""
    from PIL import Image

    try:
        if isinstance(item, Image.Image):
            img = item
        elif isinstance(item, dict) and item.get("bytes") is not None:
            img = Image.open(io.BytesIO(item["bytes"]))
        elif isinstance(item, dict) and item.get("path"):
            img = Image.open(resolve(item["path"], image_folder, row, what))
        elif isinstance(item, (bytes, bytearray)):
            img = Image.open(io.BytesIO(bytes(item)))
        elif isinstance(item, (str, Path)):
            img = Image.open(resolve(item, image_folder, row, what))
        elif isinstance(item, np.ndarray):
            img = Image.fromarray(item)
        else:
            raise TypeError(f"unsupported image type {type(item).__name__}")
        img.load()
    except SampleError:
        raise
    except Exception as e:  # noqa: BLE001 - any decode failure names the row
        raise SampleError(row, f"dataset row {row}: {what} cannot be decoded: {e}", field="images") from e
    return img


def resolve(path: str | Path, image_folder: str | None, row: object, what: str) -> Path:
    """``path`` under ``image_folder`` when relative; a missing file is the row's fault."""
    p = Path(path)
    if not p.is_absolute() and image_folder is not None:
        p = Path(image_folder) / p
    if not p.is_file():
        where = f" (under --image-folder {image_folder})" if image_folder is not None and not Path(path).is_absolute() else ""
        raise SampleError(row, f"dataset row {row}: {what} {str(path)!r} does not exist{where}", field="images")
    return p


def open_video(item: Any, image_folder: str | None, row: object, index: int) -> np.ndarray:
    """One video as frames ``[T, H, W, 3]`` uint8: an array, or a list of frames (any image form above)."""
    if isinstance(item, np.ndarray):
        frames = item
    else:
        decoded = [open_image(f, image_folder, row, f"video {index} frame {k}") for k, f in enumerate(as_list(item))]
        if not decoded:
            raise SampleError(row, f"dataset row {row}: video {index} has no frames", field="videos")
        size = decoded[0].size
        frames = np.stack([np.asarray(f.convert("RGB").resize(size)) for f in decoded])
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise SampleError(row, f"dataset row {row}: video {index} must be frames [T, H, W, 3], got {frames.shape}", field="videos")
    return np.ascontiguousarray(frames, dtype=np.uint8)
