"""A row's image and video sizes from their headers, without decoding a pixel.

Sizes are what :func:`~mimo_pipes.data.processing.media.open_image` and :func:`~mimo_pipes.data.processing.media.open_video`
would decode: the same item kinds (PIL images, ``{"bytes", "path"}`` dicts, bytes, paths under the image
folder, arrays), the same path resolution (a missing file is the row's :class:`SampleError`), and a video
given as frames has the size of its first frame (``open_video`` resizes the others to it). An item whose
size cannot be read this way raises :class:`UnreadableHeader`, naming the item; the caller then processes
the row.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mimo_pipes.data.processing.conversation import row_images, row_videos
from mimo_pipes.data.processing.media import as_list, encoded_source, path_bytes
from mimo_pipes.errors import SampleError

ImageSize = tuple[int, int]
"""(height, width) in pixels."""
VideoSize = tuple[int, int, int]
"""(frames, height, width)."""


T = TypeVar("T")


class UnreadableHeader(ValueError):
    """An image's or video's size could not be read from its header: ``"image 0: unsupported image type
    list"``. Not the row's fault as such: processing it may still succeed."""


@dataclass(frozen=True)
class MediaSizes:
    """A row's images and videos, in row order."""

    images: tuple[ImageSize, ...]
    videos: tuple[VideoSize, ...]


def image_size(item: Any, image_folder: str | None, row: object, what: str) -> ImageSize:
    """(height, width) of one image item, read from its header."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return _oriented(item)
    if isinstance(item, np.ndarray):
        width, height = Image.fromarray(item).size  # what open_image makes of it, without a decode
        return height, width
    with Image.open(encoded_source(item, image_folder, row, what)) as image:
        return _oriented(image)


ROTATED = (5, 6, 7, 8)  # EXIF orientations that turn the image by a quarter: width and height swap


def _oriented(image: Any) -> ImageSize:
    """(height, width) as :func:`~mimo_pipes.data.processing.media.open_image` decodes it: turned by its EXIF
    orientation (as transformers' ``load_image`` turns it), read from the header."""
    return (image.width, image.height) if _orientation(image) in ROTATED else (image.height, image.width)


def _orientation(image: Any) -> int:
    from PIL import Image

    if image.format == "PNG":
        # PIL reads a PNG's EXIF chunk with the pixels unless it comes before them: only that one is read
        # here (an orientation written after the pixels, rare, is not seen without decoding them).
        raw = image.info.get("exif")
        if not raw:
            return 1
        exif = Image.Exif()
        exif.load(raw)
        return int(exif.get(0x0112, 1))
    return int(image.getexif().get(0x0112, 1))


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
    """Every image's and video's size in ``row``, headers only. Raises the row's SampleError, or
    :class:`UnreadableHeader` for an item whose header gives no size."""
    images = tuple(_from_header(f"image {k}", image_size, item, image_folder, sample_id, f"image {k}") for k, item in enumerate(row_images(row)))
    videos = tuple(_from_header(f"video {k}", video_size, item, image_folder, sample_id, k) for k, item in enumerate(row_videos(row)))
    return MediaSizes(images, videos)


def _from_header(what: str, read: Callable[..., T], *args: Any) -> T:
    try:
        return read(*args)
    except SampleError:
        raise
    except Exception as error:  # noqa: BLE001 - any other failure: no size from this header
        raise UnreadableHeader(f"{what}: {' '.join(str(error).split()) or type(error).__name__}") from error


def encoded_media(row: dict, image_folder: str | None, sample_id: object, *, keep_paths: bool = False) -> dict:
    """``row`` with its images and video frames as encoded bytes, ready to move to another rank: an image
    given by path becomes ``{"bytes", "path"}`` of the file's bytes (unless ``keep_paths``: every rank
    reads the same files), a decoded PIL image its lossless PNG. Nothing is decoded; the row is copied only
    where it changes. Raises the row's SampleError for a missing file or an image PNG cannot hold."""
    changed = dict(row)
    for key in ("images", "image", "videos", "video"):
        value = row.get(key)
        if value is None:
            continue
        if key.startswith("image"):
            changed[key] = _encoded_items(value, image_folder, sample_id, "image", keep_paths)
            continue
        videos = as_list(value)  # a video is an array or a list of frames
        encoded = [v if isinstance(v, np.ndarray) else _encoded_items(v, image_folder, sample_id, f"video {k} frame", keep_paths)
                   for k, v in enumerate(videos)]
        changed[key] = encoded if isinstance(value, (list, tuple)) else encoded[0]
    return changed


def _encoded_items(value: Any, image_folder: str | None, sample_id: object, what: str, keep_paths: bool) -> Any:
    items = as_list(value)
    encoded = [_encoded(item, image_folder, sample_id, f"{what} {k}", keep_paths) for k, item in enumerate(items)]
    return encoded if isinstance(value, (list, tuple)) else encoded[0]


def _encoded(item: Any, image_folder: str | None, sample_id: object, what: str, keep_paths: bool) -> Any:
    from PIL import Image

    if isinstance(item, Image.Image):
        return {"bytes": _png(item, sample_id, what), "path": None}
    if keep_paths:
        return item
    if isinstance(item, dict) and item.get("bytes") is None and item.get("path"):
        path = item["path"]
    elif isinstance(item, (str, Path)):
        path = item
    else:
        return item
    return {"bytes": path_bytes(path, image_folder, sample_id, what), "path": str(path)}


def _png(image: Any, sample_id: object, what: str) -> bytes:
    buffer = io.BytesIO()
    try:
        exif = image.getexif()
        image.save(buffer, format="PNG", **({"exif": exif} if len(exif) else {}))
    except (OSError, ValueError, KeyError) as error:
        raise SampleError(sample_id, f"dataset row {sample_id}: {what} is a decoded {image.mode} image, which cannot move "
                          f"encoded as PNG ({error}); keep the dataset's images encoded, or use --exchange-payload samples",
                          field="images") from error
    return buffer.getvalue()
