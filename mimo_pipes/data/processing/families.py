"""Vision families: how a processor folder's image processor turns images and videos into model fields,
and how many placeholder tokens each one takes in ``input_ids``.

* :class:`PatchFamily`: Qwen2-VL, Qwen2.5-VL and Qwen3-VL (``Qwen2VLImageProcessor*``): patch-flattened
  ``pixel_values`` ``[patches, 3 * temporal_patch_size * patch_size**2]`` with ``image_grid_thw``, one
  ``<|image_pad|>`` per ``merge_size**2`` patches between ``<|vision_start|>`` and ``<|vision_end|>``;
  videos as ``pixel_values_videos`` / ``video_grid_thw`` with ``<|video_pad|>`` placeholders.
* :class:`TileFamily`: InternVL (``GotOcr2ImageProcessor*``): fixed-size tiles, ``pixel_values``
  ``[tiles, 3, H, W]`` with ``image_num_tiles`` per image, ``<img>`` + ``image_seq_length`` x
  ``<IMG_CONTEXT>`` per tile + ``</img>``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mimo_pipes.data import bad_rows
from mimo_pipes.data.processing.family_names import QWEN3_VL, folder_release
from mimo_pipes.data.processing.fast_pixels import probe
from mimo_pipes.errors import ConfigError, SampleError

FRAME_RATE = 2.0
"""Frames per second a video's frames are taken to be sampled at where a timestamp is written (Qwen3-VL): the
rate Qwen-VL video processors sample at by default."""
Features = tuple[dict[str, np.ndarray], list[list[int]]]
"""Model fields for a sample's images (or videos), and each one's placeholder token ids."""


def _token_id(tokenizer: Any, token: str, source: str | None, required: bool = True) -> int | None:
    tid = tokenizer.backend_tokenizer.token_to_id(token)
    if tid is None and required:
        raise ConfigError("--processor", f"the tokenizer from {source!r} lacks the token {token}")
    return tid


class PatchFamily:
    """Qwen2-VL-style patches (see the module doc). ``release``: ``qwen2-vl``, ``qwen2.5-vl`` or ``qwen3-vl`` as the
    folder names itself (:mod:`~mimo_pipes.data.processing.family_names`), None when it does not: the layout is
    the same, the M-RoPE of videos is not."""

    UNKNOWN = "qwen-vl (release not named by the folder)"

    def __init__(self, tokenizer: Any, image_processor: Any, source: str | None, release: str | None = None) -> None:
        self.release = release
        self.name = release or self.UNKNOWN
        for attr in ("patch_size", "temporal_patch_size", "merge_size"):
            if not isinstance(getattr(image_processor, attr, None), int):
                raise ConfigError(
                    "--processor", f"the image processor from {source!r} ({type(image_processor).__name__}) has no integer {attr}"
                )
        self.image_processor = image_processor
        self.pixel_table = probe(image_processor)  # None: this processor's own path for every image
        self.patch_size: int = image_processor.patch_size
        self.temporal_patch_size: int = image_processor.temporal_patch_size
        self.merge_size: int = image_processor.merge_size
        self.patch_dim = 3 * self.temporal_patch_size * self.patch_size**2
        self.image_pad = "<|image_pad|>"
        self.video_pad = "<|video_pad|>"
        self.markers = {"image": "<|vision_start|><|image_pad|><|vision_end|>", "video": "<|vision_start|><|video_pad|><|vision_end|>"}
        self.vision_start_id, self.vision_end_id = (_token_id(tokenizer, token, source) for token in ("<|vision_start|>", "<|vision_end|>"))
        self.image_token_id = _token_id(tokenizer, self.image_pad, source)
        self.video_token_id = _token_id(tokenizer, self.video_pad, source, required=False)
        # Qwen3-VL's processor writes a video as one block per frame, each after its timestamp ("<0.2 seconds>"),
        # in place of the chat's single block: the chat's wrapper becomes the bare pad, and the pad's run holds
        # every frame's timestamp, start, placeholders and end (see _frame_runs).
        self.video_wrapper = self.markers["video"] if release == QWEN3_VL else None
        self._text = tokenizer.backend_tokenizer if self.video_wrapper is not None else None
        self.placeholder_ids = tuple(t for t in (self.image_token_id, self.video_token_id) if t is not None)
        self.vision_fields: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "pixel_values": ((self.patch_dim,), torch.float32),
            "image_grid_thw": ((3,), torch.int64),
        }
        if self.video_token_id is not None:
            self.vision_fields.update(pixel_values_videos=((self.patch_dim,), torch.float32), video_grid_thw=((3,), torch.int64))

    def images(self, images: list, sample: object) -> Features:
        try:
            if self.pixel_table is not None and self.pixel_table.handles(images):
                pixels, grid = self.pixel_table.pixels(images)  # the processor's values, bit for bit (fast_pixels.py)
            else:
                feats = self.image_processor(images=images, return_tensors="np")
                pixels = np.ascontiguousarray(feats["pixel_values"], dtype=np.float32)
                grid = np.asarray(feats["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
        except Exception as e:  # noqa: BLE001 - any failure is the row's
            raise SampleError(sample, f"dataset row {sample}: the image processor failed: {e}", field="images",
                              kind=bad_rows.REFUSED_MEDIA) from e
        return {"pixel_values": pixels, "image_grid_thw": grid}, self._tokens(grid, pixels, self.image_token_id, sample, "images")

    def videos(self, videos: list[np.ndarray], sample: object) -> Features:
        if self.video_token_id is None:
            raise SampleError(sample, f"dataset row {sample}: has videos but the tokenizer has no {self.video_pad}", field="videos",
                              kind=bad_rows.REFUSED_MEDIA)
        patches, grids = zip(*(self._patchify(frames) for frames in videos))
        pixels, grid = np.concatenate(patches), np.asarray(grids, dtype=np.int64)
        return {"pixel_values_videos": pixels, "video_grid_thw": grid}, self._tokens(grid, pixels, self.video_token_id, sample, "videos")

    def image_layout(self, sizes: Sequence[tuple[int, int]], sample: object) -> Features:
        """What :meth:`images` makes of images of these (height, width) sizes, without their pixels: the
        grid field and the placeholder runs, through the image processor's own resize rule."""
        grid = np.asarray([self.image_grid(height, width) for height, width in sizes], dtype=np.int64).reshape(-1, 3)
        return {"image_grid_thw": grid}, self._runs(grid, self.image_token_id)

    def video_layout(self, sizes: Sequence[tuple[int, int, int]], sample: object) -> Features:
        """What :meth:`videos` makes of videos of these (frames, height, width) sizes, without their pixels."""
        if self.video_token_id is None:
            raise SampleError(sample, f"dataset row {sample}: has videos but the tokenizer has no {self.video_pad}", field="videos",
                              kind=bad_rows.REFUSED_MEDIA)
        grid = np.asarray([self.video_grid(*size) for size in sizes], dtype=np.int64).reshape(-1, 3)
        return {"video_grid_thw": grid}, self._runs(grid, self.video_token_id)

    def image_grid(self, height: int, width: int) -> list[int]:
        """``image_grid_thw`` of one image: the image processor's ``smart_resize`` (its own module's, with
        its min and max pixels) to multiples of patch x merge, in patches; one temporal step."""
        ip = self.image_processor
        if getattr(ip, "do_resize", True):
            rule = getattr(sys.modules.get(type(ip).__module__), "smart_resize", None)
            if rule is None:
                from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as rule
            size = ip.size
            height, width = rule(height, width, factor=self.patch_size * self.merge_size,
                                 min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"])
        elif height % self.patch_size or width % self.patch_size:
            raise ValueError(f"{height} x {width} is not a multiple of the patch size {self.patch_size}")
        return [1, height // self.patch_size, width // self.patch_size]

    def video_grid(self, frames: int, height: int, width: int) -> list[int]:
        """``video_grid_thw`` of one video, as :meth:`_patchify` lays it out."""
        height, width = self._resized(height, width, self.patch_size * self.merge_size)
        return [-(-frames // self.temporal_patch_size), height // self.patch_size, width // self.patch_size]

    def _runs(self, grid: np.ndarray, token: int) -> list[list[int]]:
        if token == self.video_token_id and self.video_wrapper is not None:
            return self._frame_runs(grid)
        return [[token] * int(n // self.merge_size**2) for n in grid.prod(axis=1)]

    def _frame_runs(self, grid: np.ndarray) -> list[list[int]]:
        """Qwen3-VL's video blocks: per temporal step ``<t seconds>`` + start + its ``h * w / m**2`` placeholders +
        end. Frames come without their times here: they are taken as sampled at FRAME_RATE per second, and a step's
        time is the mean of its frames' (the processor's rule, ``_calculate_timestamps``)."""
        assert self._text is not None and self.video_token_id is not None
        out = []
        for t, h, w in grid.tolist():
            run: list[int] = []
            for step in range(int(t)):
                first = step * self.temporal_patch_size
                seconds = (first + first + self.temporal_patch_size - 1) / 2 / FRAME_RATE
                run += self._text.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False).ids
                run += [self.vision_start_id] + [self.video_token_id] * (int(h) * int(w) // self.merge_size**2) + [self.vision_end_id]
            out.append(run)
        return out

    def _tokens(self, grid: np.ndarray, pixels: np.ndarray, token: int, sample: object, field: str) -> list[list[int]]:
        patches = grid.prod(axis=1)
        merge2 = self.merge_size**2
        if pixels.shape[0] != int(patches.sum()) or np.any(patches % merge2):
            raise SampleError(sample, f"dataset row {sample}: {pixels.shape[0]} patch rows do not match grids {grid.tolist()}", field=field)
        return self._runs(grid, token)

    def _patchify(self, frames: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Frames ``[T, H, W, 3]`` as the image processor treats an image, with time as the temporal axis."""
        from PIL import Image

        ip = self.image_processor
        factor = self.patch_size * self.merge_size
        height, width = self._resized(frames.shape[1], frames.shape[2], factor)
        resized = np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.BICUBIC)) for f in frames])
        pixels = resized.astype(np.float32) / 255.0
        pixels = (pixels - np.asarray(ip.image_mean, dtype=np.float32)) / np.asarray(ip.image_std, dtype=np.float32)
        pixels = pixels.transpose(0, 3, 1, 2)  # T, C, H, W
        tps, ps, m = self.temporal_patch_size, self.patch_size, self.merge_size
        if pixels.shape[0] % tps:
            pixels = np.concatenate([pixels, np.repeat(pixels[-1:], tps - pixels.shape[0] % tps, axis=0)])
        gt, gh, gw = pixels.shape[0] // tps, height // ps, width // ps
        patches = pixels.reshape(gt, tps, 3, gh // m, m, ps, gw // m, m, ps).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return np.ascontiguousarray(patches.reshape(gt * gh * gw, 3 * tps * ps * ps)), [gt, gh, gw]

    def _resized(self, height: int, width: int, factor: int) -> tuple[int, int]:
        import math

        size = getattr(self.image_processor, "size", None) or {}
        lo = size.get("shortest_edge", factor * factor)
        hi = size.get("longest_edge", 1280 * factor * factor)
        h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
        if h * w > hi:
            beta = math.sqrt(height * width / hi)
            h, w = max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
        elif h * w < lo:
            beta = math.sqrt(lo / (height * width))
            h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return h, w


class TileFamily:
    """InternVL-style fixed tiles (see the module doc). Videos are not supported."""

    name = "internvl"

    def __init__(self, tokenizer: Any, image_processor: Any, source: str | None, image_seq_length: int) -> None:
        self.image_processor = image_processor
        self.image_seq_length = int(image_seq_length)
        self.image_pad = "<IMG_CONTEXT>"
        self.video_pad = None
        self.markers = {"image": "<IMG_CONTEXT>"}
        self.start_id = _token_id(tokenizer, "<img>", source)
        self.end_id = _token_id(tokenizer, "</img>", source)
        self.image_token_id = _token_id(tokenizer, self.image_pad, source)
        self.video_token_id = None
        self.placeholder_ids = (self.image_token_id,)
        size = image_processor.size
        height, width = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
        self.vision_fields = {"pixel_values": ((3, height, width), torch.float32), "image_num_tiles": ((), torch.int64)}

    def images(self, images: list, sample: object) -> Features:
        try:
            feats = self.image_processor(images=images, return_tensors="np")
        except Exception as e:  # noqa: BLE001
            raise SampleError(sample, f"dataset row {sample}: the image processor failed: {e}", field="images",
                              kind=bad_rows.REFUSED_MEDIA) from e
        pixels = np.ascontiguousarray(feats["pixel_values"], dtype=np.float32)
        tiles = np.asarray(feats["num_patches"], dtype=np.int64).reshape(-1)
        if pixels.shape[0] != int(tiles.sum()):
            raise SampleError(sample, f"dataset row {sample}: {pixels.shape[0]} tiles, but num_patches {tiles.tolist()}", field="images")
        return {"pixel_values": pixels, "image_num_tiles": tiles}, self._runs(tiles)

    def videos(self, videos: list[np.ndarray], sample: object) -> Features:
        raise SampleError(sample, f"dataset row {sample}: videos are not supported by the {self.name} family", field="videos", kind=bad_rows.REFUSED_MEDIA)

    def image_layout(self, sizes: Sequence[tuple[int, int]], sample: object) -> Features:
        """What :meth:`images` makes of images of these (height, width) sizes, without their pixels: tiles
        per image from the image processor's own tiling rule (``get_number_of_image_patches``)."""
        tiles = np.asarray([self.image_processor.get_number_of_image_patches(h, w) for h, w in sizes], dtype=np.int64).reshape(-1)
        return {"image_num_tiles": tiles}, self._runs(tiles)

    def video_layout(self, sizes: Sequence[tuple[int, int, int]], sample: object) -> Features:
        return self.videos([], sample)

    def _runs(self, tiles: np.ndarray) -> list[list[int]]:
        return [[self.start_id] + [self.image_token_id] * (self.image_seq_length * int(n)) + [self.end_id] for n in tiles]


def family_for(tokenizer: Any, image_processor: Any, source: str | None, processor_config: dict) -> PatchFamily | TileFamily:
    kind = type(image_processor).__name__
    if kind.startswith("Qwen2VLImageProcessor"):
        folder = Path(source) if source is not None and Path(source).is_dir() else None
        return PatchFamily(tokenizer, image_processor, source, folder_release(folder, processor_config))
    if kind.startswith("GotOcr2ImageProcessor"):
        return TileFamily(tokenizer, image_processor, source, processor_config.get("image_seq_length", 256))
    raise ConfigError(
        "--processor", f"{source!r}: image processor {kind} is not supported (Qwen2VLImageProcessor for Qwen2/2.5/3-VL, "
        "GotOcr2ImageProcessor for InternVL)"
    )
