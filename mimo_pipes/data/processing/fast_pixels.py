"""Qwen2-VL-style pixels without the float64 detour: the image processor's own resize (PIL's, on the decoded
image, to the size of the processor's rule), then rescale and normalize as one lookup table per channel, applied
while the 8-bit pixels are laid out as patches.

The processor's PIL path rescales a resized 8-bit image in float64, normalizes it in float32 and lays the
float32 image out as patches, copying it three or four times (benchmarks/pixel_table.py: about 10% of a row's
processing CPU once memory is warm, more where fresh pages are faulted in). An 8-bit channel has 256 values, so
rescale-then-normalize is a table of 256
float32 numbers per channel, computed once by the processor's own ``rescale`` and ``normalize``: each output
value is the one the processor computes, bit for bit, and the patches are laid out from bytes.

The table only holds where the processor works as assumed: ``probe`` compares the two paths on probe images
when a processor is opened and returns None (the processor's own path is then used for everything) if any
value differs or anything raises. Only plain RGB images take this path; other modes, a transparent colour,
and anything else the processor accepts go through the processor itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from mimo_pipes.samples.pixel_destination import take_destination

CHANNELS = 3
# Small probe images (a processor is opened with every graph built): one below the smallest pixel count of the
# processor's defaults (resized up), odd sizes and aspect ratios (resized to multiples of the patch); fixed noise.
# Resizing down past the largest pixel count is the same PIL call, to the size of the same rule (tests/unit/test_fast_pixels.py
# holds large photos and scans to the processor).
PROBE_SIZES = ((17, 23), (64, 200), (301, 97))


class PixelTable:
    """Rescale-and-normalize of one image processor as a per-channel table, and the patch layout around it."""

    def __init__(self, image_processor: Any) -> None:
        self.image_processor = image_processor
        options = preprocess_options(image_processor)
        self.size = options["size"]
        self.resample = options["resample"]
        self.do_resize = bool(options["do_resize"])
        self.patch_size: int = options["patch_size"]
        self.merge_size: int = options["merge_size"]
        self.temporal_patch_size: int = options["temporal_patch_size"]
        self.rule = resize_rule(image_processor)
        values = np.broadcast_to(np.arange(256, dtype=np.uint8), (CHANNELS, 1, 256)).copy()
        if options["do_rescale"]:
            values = image_processor.rescale(values, options["rescale_factor"])
        if options["do_normalize"]:
            values = image_processor.normalize(values, options["image_mean"], options["image_std"])
        self.table = np.ascontiguousarray(np.asarray(values, dtype=np.float32)[:, 0, :])  # [channel, 8-bit value]

    def handles(self, images: list) -> bool:
        """Whether every image is one this path takes: 8-bit RGB PIL images without a transparent colour (the
        processor composites those onto white first, as it does images with alpha)."""
        return all(getattr(image, "mode", None) == "RGB" and image.info.get("transparency") is None for image in images)

    def pixels(self, images: list) -> tuple[np.ndarray, np.ndarray]:
        """``(pixel_values [patches, 3 * temporal * patch**2] float32, image_grid_thw [images, 3] int64)``."""
        layouts = [self._resized(image) for image in images]
        grids = np.asarray([[1, h // self.patch_size, w // self.patch_size] for h, w, _ in (a.shape for a in layouts)], dtype=np.int64)
        rows = int((grids[:, 1] * grids[:, 2]).sum())
        patch, temporal = self.patch_size, self.temporal_patch_size
        offered = take_destination((rows, CHANNELS * temporal * patch * patch), np.float32)  # the micro-batch's rows, if offered
        shape = (rows, CHANNELS, temporal, patch, patch)
        out = offered.reshape(shape) if offered is not None else np.empty(shape, dtype=np.float32)
        start = 0
        for resized, (_, grid_h, grid_w) in zip(layouts, grids):
            count = int(grid_h * grid_w)
            self._patches_into(resized, int(grid_h), int(grid_w), out[start:start + count])
            start += count
        return out.reshape(rows, -1), grids

    def _resized(self, image: Any) -> np.ndarray:
        """The image as ``[height, width, 3]`` uint8, resized by the processor's own rule and resampling.

        The processor's PIL path turns the image into an array, lays it out channels first and back, and makes a
        PIL image of it again before resizing: four copies of the full image (36 MB for a 12 MP photo) around a
        resize that reads the same pixels. Here PIL resizes the decoded image itself, to the size the processor's
        rule gives, with its resampling: the same call on the same pixels (the probe holds it to the processor)."""
        if not self.do_resize:
            return rgb_pixels(image)
        height, width = self.rule(image.height, image.width, factor=self.patch_size * self.merge_size,
                                  min_pixels=self.size.shortest_edge, max_pixels=self.size.longest_edge)
        return rgb_pixels(image.resize((width, height), resample=self.resample, reducing_gap=None))

    def _patches_into(self, resized: np.ndarray, grid_h: int, grid_w: int, out: np.ndarray) -> None:
        """Lay ``resized`` [H, W, C] out as the processor's patches (merge blocks in row order, each patch
        channel-major, every frame of the temporal patch the same image) straight into ``out`` [patches, C, T, P, P].

        The 8-bit pixels are put in patch order first (a quarter of the bytes a float image moves), then each
        channel's table is read into the first frame, which the other frames copy."""
        merge, patch = self.merge_size, self.patch_size
        count = grid_h * grid_w
        blocks = resized.reshape(grid_h // merge, merge, patch, grid_w // merge, merge, patch, CHANNELS).transpose(0, 3, 1, 4, 6, 2, 5)
        ordered = np.ascontiguousarray(blocks).reshape(count, CHANNELS, patch * patch)
        frames = out.reshape(count, CHANNELS, self.temporal_patch_size, patch * patch)
        for channel in range(CHANNELS):  # values < 256: 'clip' never clips, and skips take's bounds check and buffering
            np.take(self.table[channel], ordered[:, channel], out=frames[:, channel, 0], mode="clip")
        for frame in range(1, self.temporal_patch_size):
            frames[:, :, frame] = frames[:, :, 0]


def resize_rule(image_processor: Any) -> Callable[..., tuple[int, int]]:
    """The ``smart_resize`` the processor's ``resize`` calls: its own module's (Qwen2-VL's where it has none)."""
    rule = getattr(sys.modules.get(type(image_processor).__module__), "smart_resize", None)
    if rule is None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as rule
    return rule


def preprocess_options(image_processor: Any) -> dict:
    """The options the processor's ``preprocess`` runs with when given none: its own settings, standardized
    (``size`` as a ``SizeDict``, ``min_pixels``/``max_pixels`` folded into it). transformers 5.18 and later
    name this step; 5.17 does it inline in ``preprocess``, from the same two pieces."""
    if hasattr(image_processor, "_merge_and_standardize_kwargs"):
        return image_processor._merge_and_standardize_kwargs()
    names = image_processor._valid_kwargs_names
    return image_processor._standardize_kwargs(**{name: getattr(image_processor, name, None) for name in names})


def probe(image_processor: Any) -> PixelTable | None:
    """A :class:`PixelTable` for ``image_processor`` if it gives exactly what the processor gives on the probe
    images; None otherwise (or if building or running it raises)."""
    from PIL import Image

    try:
        table = PixelTable(image_processor)
        rng = np.random.default_rng(0)
        images = [Image.fromarray(rng.integers(0, 256, (height, width, CHANNELS), dtype=np.uint8), "RGB") for height, width in PROBE_SIZES]
        for batch in ([image] for image in images):
            expected = image_processor(images=batch, return_tensors="np")
            pixels, grid = table.pixels(batch)
            reference = np.asarray(expected["pixel_values"])
            if reference.dtype != np.float32 or not np.array_equal(reference, pixels) or not np.array_equal(np.asarray(expected["image_grid_thw"]), grid):
                return None
        return table
    except Exception:  # noqa: BLE001 - any processor this path does not fit keeps its own path
        return None


def rgb_pixels(image: Any) -> np.ndarray:
    """An RGB PIL image's pixels as ``[height, width, 3]`` uint8: a view of PIL's own memory (its 4-byte pixels,
    exported through Arrow's C data interface: no copy) where PIL can export it, else a copy (``np.asarray``).
    The copy runs PIL's ``tobytes``, which holds the GIL throughout (about 1 ms a resized image): with many
    worker threads that was one of the largest waits for the GIL of a row's processing."""
    try:
        import pyarrow

        exported = pyarrow.array(image)  # the pixels as PIL holds them: [height * width] x 4 bytes (RGB and a pad byte)
    except Exception:  # noqa: BLE001 - no pyarrow, an older PIL, or memory PIL cannot export in one piece
        return np.asarray(image)
    pixels = np.frombuffer(exported.buffers()[-1], dtype=np.uint8)  # the buffer keeps PIL's memory alive
    if pixels.size != image.height * image.width * 4 or exported.offset:
        return np.asarray(image)
    return pixels.reshape(image.height, image.width, 4)[..., :CHANNELS]
