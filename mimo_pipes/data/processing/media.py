"""Decoding a row's images and videos: paths (inside an image folder), bytes, ``datasets.Image`` values,
PIL images or arrays. Every failure is a :class:`SampleError` naming the dataset row.

A path from the data resolves, symlinks followed, inside the image folder, or the row is bad and the file
is never opened. An image is then what transformers' ``load_image`` makes of it: turned by its EXIF
orientation and converted to RGB (CMYK, grayscale, palette, 16-bit; alpha and palette transparency
dropped; the first frame of an animation), so the family's image processor sees what it sees in
transformers."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np

from mimo_pipes.data import bad_rows
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import SampleError


def as_list(value: Any) -> list:
    """``None`` -> ``[]``; a list or tuple as a list; anything else as a one-item list."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def open_image(item: Any, image_folder: str | None, row: object, what: str):
    """One image as a loaded RGB PIL image, as ``transformers.image_utils.load_image`` loads it."""
    from PIL import Image, ImageOps

    try:
        if isinstance(item, np.ndarray):
            item = Image.fromarray(item)
        if isinstance(item, Image.Image):
            return ImageOps.exif_transpose(item).convert("RGB")  # transformers' load_image, step for step
        img = Image.open(encoded_source(item, image_folder, row, what))
        if getattr(img, "n_frames", 1) == 1:  # one frame: its file closes once loaded, and the image is ours to change
            ImageOps.exif_transpose(img, in_place=True)  # load_image's steps, without their two copies of the whole image
            return img if img.mode == "RGB" else img.convert("RGB")
        with img:  # closed once converted (an animation keeps its file open)
            return ImageOps.exif_transpose(img).convert("RGB")
    except SampleError:
        raise
    except Exception as e:  # noqa: BLE001 - any decode failure names the row
        if isinstance(item, dict) and item.get("bytes") is not None and item.get("path"):
            what = f"{what} ({item['path']})"  # where the bytes came from: an Energon sample's shard and key
        # A stream's repr holds its address ('<_io.BytesIO object at 0x...>'): dropped, so that a row's reason reads
        # alike in every process (the run's ranks, analyze) and every time.
        text = re.sub(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>", "", str(e))
        raise SampleError(row, f"dataset row {row}: {what} cannot be decoded: {text}", field="images", kind=bad_rows.UNREADABLE_IMAGE) from e


def encoded_source(item: Any, image_folder: str | None, row: object, what: str) -> io.BytesIO | Path:
    """What ``Image.open`` reads for an encoded image item: its bytes (raw, or a ``{"bytes", "path"}``
    value's) or its path, resolved inside the image folder (see :func:`resolve`). TypeError for any other
    kind (PIL images and arrays hold pixels already)."""
    if isinstance(item, dict) and item.get("bytes") is not None:
        return io.BytesIO(item["bytes"])
    if isinstance(item, dict) and item.get("path"):
        return _file(item["path"], image_folder, row, what)
    if isinstance(item, (bytes, bytearray)):
        return io.BytesIO(bytes(item))
    if isinstance(item, (str, Path)):
        return _file(item, image_folder, row, what)
    raise TypeError(f"unsupported image type {type(item).__name__}")


def _file(path: str | Path, image_folder: str | None, row: object, what: str) -> io.BytesIO | Path:
    """The file ``path`` names: resolved on disk, or its bytes fetched from an ``s3://`` image folder."""
    return io.BytesIO(path_bytes(path, image_folder, row, what)) if is_s3(image_folder) else resolve(path, image_folder, row, what)


def path_bytes(path: str | Path, image_folder: str | None, row: object, what: str) -> bytes:
    """The bytes of the file ``path`` names inside ``image_folder`` (a folder, or an ``s3://`` folder URL)."""
    if is_s3(image_folder):
        from mimo_pipes.data.storage.s3_images import image_bytes

        return image_bytes(path, str(image_folder), row, what)
    return resolve(path, image_folder, row, what).read_bytes()


def resolve(path: str | Path, image_folder: str | Path | None, row: object, what: str) -> Path:
    """The file ``path`` (relative to ``image_folder``, or absolute) names, symlinks resolved; SampleError
    when it lies outside the folder (the resolved path is not printed), is missing, or there is no folder.
    A missing file's error says which flag sets the folder: a relative path is most often missing because
    the folder is not the one the data's paths are relative to."""
    if image_folder is None:
        raise SampleError(row, f"dataset row {row}: {what} {str(path)!r} is a path, but no image folder is set (--image-folder)",
                          field="images", kind=bad_rows.NO_IMAGE_FOLDER)
    root = Path(image_folder).expanduser().resolve()
    real = (root / Path(path)).resolve()
    if not real.is_relative_to(root):
        raise SampleError(row, f"dataset row {row}: {what} {str(path)!r} is outside the image folder", field="images",
                          kind=bad_rows.OUTSIDE_IMAGE_FOLDER)
    if not real.is_file():
        raise SampleError(row, f"dataset row {row}: {what} {str(path)!r} does not exist under the image folder {image_folder} "
                               "(--image-folder; default: the dataset's folder)", field="images", kind=bad_rows.MISSING_IMAGE)
    return real


def open_video(item: Any, image_folder: str | None, row: object, index: int) -> np.ndarray:
    """One video as frames ``[T, H, W, 3]`` uint8: an array, or a list of frames (any image form above)."""
    if isinstance(item, np.ndarray):
        frames = item
    else:
        decoded = [open_image(f, image_folder, row, f"video {index} frame {k}") for k, f in enumerate(as_list(item))]
        if not decoded:
            raise SampleError(row, f"dataset row {row}: video {index} has no frames", field="videos", kind=bad_rows.MALFORMED_VIDEO)
        size = decoded[0].size
        frames = np.stack([np.asarray(f.resize(size)) for f in decoded])
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise SampleError(row, f"dataset row {row}: video {index} must be frames [T, H, W, 3], got {frames.shape}", field="videos",
                          kind=bad_rows.MALFORMED_VIDEO)
    return np.ascontiguousarray(frames, dtype=np.uint8)
