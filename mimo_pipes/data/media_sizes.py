"""A row's image and video sizes from their headers, without decoding a pixel.

Sizes are what :func:`~mimo_pipes.data.media.open_image` and :func:`~mimo_pipes.data.media.open_video`
would decode: the same item kinds (PIL images, ``{"bytes", "path"}`` dicts, bytes, paths under the image
folder, arrays), the same path resolution (a missing file is the row's :class:`SampleError`), and a video
given as frames has the size of its first frame (``open_video`` resizes the others to it). An item whose
size cannot be read this way raises something other than SampleError; the caller then processes the row.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mimo_pipes.data.conversation import row_images, row_videos
from mimo_pipes.data.media import as_list, resolve

ImageSize = tuple[int, int]
"""(height, width) in pixels."""
VideoSize = tuple[int, int, int]
"""(frames, height, width)."""


@dataclass(frozen=True)
class MediaSizes:
    """A row's images and videos, in row order."""

    images: tuple[ImageSize, ...]
    videos: tuple[VideoSize, ...]


def image_size(item: Any, image_folder: str | None, row: object, what: str) -> ImageSize:
    """(height, width) of one image item, read from its header."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item.height, item.width
    if isinstance(item, np.ndarray):
        width, height = Image.fromarray(item).size  # what open_image makes of it, without a decode
        return height, width
    if isinstance(item, dict) and item.get("bytes") is not None:
        source: Any = io.BytesIO(item["bytes"])
    elif isinstance(item, dict) and item.get("path"):
        source = resolve(item["path"], image_folder, row, what)
    elif isinstance(item, (bytes, bytearray)):
        source = io.BytesIO(bytes(item))
    elif isinstance(item, (str, Path)):
        source = resolve(item, image_folder, row, what)
    else:
        raise TypeError(f"unsupported image type {type(item).__name__}")
    with Image.open(source) as image:
        return image.height, image.width


def video_size(item: Any, image_folder: str | None, row: object, index: int) -> VideoSize:
    """(frames, height, width) of one video: an array ``[T, H, W, 3]`` or a list of frames."""
    if isinstance(item, np.ndarray):
        if item.ndim != 4 or item.shape[-1] != 3 or item.shape[0] == 0:
            raise ValueError(f"video {index} must be frames [T, H, W, 3], got {item.shape}")
        return int(item.shape[0]), int(item.shape[1]), int(item.shape[2])
    frames = as_list(item)
    if not frames:
        raise ValueError(f"video {index} has no frames")
    height, width = image_size(frames[0], image_folder, row, f"video {index} frame 0")
    return len(frames), height, width


def media_sizes(row: dict, image_folder: str | None, sample_id: object) -> MediaSizes:
    """Every image's and video's size in ``row``, headers only."""
    images = tuple(image_size(item, image_folder, sample_id, f"image {k}") for k, item in enumerate(row_images(row)))
    videos = tuple(video_size(item, image_folder, sample_id, k) for k, item in enumerate(row_videos(row)))
    return MediaSizes(images, videos)


def with_image_bytes(row: dict, image_folder: str | None, sample_id: object) -> dict:
    """``row`` with every image and video frame given by path replaced by ``{"bytes", "path"}`` of the
    file's bytes, so that the row can be processed where the file cannot be read. Nothing is decoded;
    the row is copied only where it changes."""
    changed = dict(row)
    for key in ("images", "image", "videos", "video"):
        value = row.get(key)
        if value is None:
            continue
        if key.startswith("image"):
            loaded = _loaded_items(value, image_folder, sample_id, "image")
        else:  # a video is an array or a list of frames
            videos = as_list(value)
            loaded = [v if isinstance(v, np.ndarray) else _loaded_items(v, image_folder, sample_id, f"video {k} frame")
                      for k, v in enumerate(videos)]
            loaded = loaded if isinstance(value, (list, tuple)) else loaded[0]
        changed[key] = loaded
    return changed


def _loaded_items(value: Any, image_folder: str | None, sample_id: object, what: str) -> Any:
    items = as_list(value)
    loaded = [_loaded(item, image_folder, sample_id, f"{what} {k}") for k, item in enumerate(items)]
    return loaded if isinstance(value, (list, tuple)) else loaded[0]


def _loaded(item: Any, image_folder: str | None, sample_id: object, what: str) -> Any:
    if isinstance(item, dict) and item.get("bytes") is None and item.get("path"):
        path = item["path"]
    elif isinstance(item, (str, Path)):
        path = item
    else:
        return item
    return {"bytes": resolve(path, image_folder, sample_id, what).read_bytes(), "path": str(path)}
