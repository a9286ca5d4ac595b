"""What vision grids and patch rows must be, for a Qwen2-VL-style encoder: the rules that the tail's entry
check (a sample, :func:`~mimo_pipes.samples.checks.check_sample`) and ``mimo_batch`` (a micro-batch) share.

A grid field holds one ``(t, h, w)`` row per image or video, in patches; its patch field holds one row per
patch, the images' rows one after another (``t * h * w`` rows each, as the processors lay them out). Patch
rows are pixels normalised by the processor: floating point. Each function returns what is wrong, in words
that follow the field's name, or None; the caller raises its own error naming the sample or micro-batch.
"""

from __future__ import annotations

import torch

GRIDS = {"image_grid_thw": "pixel_values", "video_grid_thw": "pixel_values_videos"}
"""Each (t, h, w) grid field and the field of patches it describes, one row per patch."""


def grid_problem(grid: object, grid_name: str) -> str | None:
    """What is wrong with the value of the grid field ``grid_name``: an integer ``[items, 3]`` tensor of
    positive (t, h, w)."""
    form = f"an integer [{'videos' if grid_name.startswith('video') else 'images'}, 3] tensor of (t, h, w)"
    if not isinstance(grid, torch.Tensor):
        return f"must be {form}, got a {type(grid).__name__}"
    if grid.dim() != 2 or grid.shape[1] != 3 or grid.dtype.is_floating_point or grid.dtype.is_complex or grid.dtype == torch.bool:
        return f"must be {form}, got {grid.dtype} of shape {tuple(grid.shape)}"
    rows = grid.tolist()  # a few items: Python arithmetic costs less than tensor ops (every sample, every step)
    if any(value < 1 for row in rows for value in row):
        return f"has a (t, h, w) row below 1: {rows}"
    return None


def patches_dtype_problem(patches: object) -> str | None:
    """What is wrong with a patch field's type: a floating point tensor with a row dimension."""
    if not isinstance(patches, torch.Tensor) or patches.dim() < 1:
        what = "a 0-d tensor" if isinstance(patches, torch.Tensor) else f"a {type(patches).__name__}"
        return f"must be a floating point tensor of patch rows, got {what}"
    if not patches.dtype.is_floating_point:
        return f"must be floating point (pixels as the processor normalises them), got {patches.dtype}"
    return None


def patch_rows_problem(grid: torch.Tensor, patches: torch.Tensor, patches_name: str, holder: str) -> str | None:
    """What is wrong between a valid grid and the patches ``holder`` has (said of the grid): a patch field
    holds ``sum(t * h * w)`` rows over the grid's items."""
    described = sum(t * h * w for t, h, w in grid.tolist())
    if described != patches.shape[0]:
        return (f"describes {described} patches but {holder} has {patches.shape[0]} rows of {patches_name} "
                "(one row per patch: the sum of t * h * w over the items)")
    return None
