"""What :func:`~mimo_pipes.megatron.batch.mimo_batch` takes, checked where a micro-batch enters it: a malformed
micro-batch is refused in one line naming the micro-batch and the field, instead of passing on to fail in a
model on a GPU, or failing inside the M-RoPE or vision code with a bare error.

A micro-batch is a mapping of field names to tensors; a field that is absent or None is not there:

* token fields, ``[B, S]`` as ``input_ids`` is: ``input_ids`` and ``labels`` int32 or int64,
  ``attention_mask`` integer or bool, ``loss_mask`` real or bool, and (read only with ``mrope=False``)
  ``position_ids`` int32 or int64 ``[B, S]``, ``[B, 3, S]`` or ``[3, B, S]`` (``B, S`` from the first of
  these fields an encoder module's micro-batch, which has no ``input_ids``, holds);
* vision fields (:mod:`mimo_pipes.samples.grids`): grids integer ``[items, 3]``, every ``t, h, w`` at least 1
  and ``h, w`` multiples of ``spatial_merge_size``; patch rows floating point, ``[patches, patch dim]``
  beside a grid, with as many rows as the grid's ``t * h * w`` add up to;
* a packed micro-batch (it has ``cu_seqlens``): one row; ``cu_seqlens`` and ``cu_seqlens_unpadded`` integer
  ``[sequences + 1]`` from 0, ascending, the padded ends reaching ``S``, each real length within its padded
  one; ``max_seqlen`` an integer at least the longest padded sequence;
* videos whose placeholders must be found in ``input_ids`` (for M-RoPE, or to order them among images for
  one encoder) need ``video_token_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.samples.checks import is_integer, wide_integer
from mimo_pipes.samples.grids import GRIDS, grid_problem, patch_rows_problem, patches_dtype_problem
from mimo_pipes.samples.mrope_layout import MROPE_ROWS, POSITION_IDS
from mimo_pipes.samples.thd import CU_SEQLENS, CU_SEQLENS_UNPADDED, MAX_SEQLEN

TOKEN_FIELDS = ("input_ids", "attention_mask", "labels", "loss_mask", POSITION_IDS)
UNKNOWN_STEP = "?"


class MimoBatchError(ValueError, TypeError):
    """A micro-batch ``mimo_batch`` refuses: ``mimo_batch: micro-batch STEP: ...``, naming ``field`` (None
    where fields disagree). A ValueError and a TypeError both, so that either ``except`` a caller wrote holds.
    Rebuilt from its message alone (pickling, a DataLoader worker's ``ExceptionWrapper``), it keeps the
    message; ``step`` and ``field`` are then None."""

    def __init__(self, step: object, field: str | None = None, message: str | None = None) -> None:
        if message is None:  # rebuilt from the whole message
            self.step, self.field = None, None
            super().__init__(step)
            return
        self.step, self.field = step, field
        super().__init__(f"mimo_batch: micro-batch {step}: {message}")


def step_of(batch: object) -> object:
    """The micro-batch's ``step`` for messages; ``?`` where it has none."""
    step = batch.get("step") if isinstance(batch, Mapping) else None
    if isinstance(step, torch.Tensor) and step.dim() == 0 and not step.dtype.is_floating_point:
        step = int(step)
    return step if is_integer(step) else UNKNOWN_STEP


def check_microbatch(batch: object, settings: MimoBatchSettings) -> None:
    """Raise :class:`MimoBatchError` for the first thing ``batch`` breaks of what the module doc lists."""
    step = step_of(batch)
    if not isinstance(batch, Mapping):
        raise MimoBatchError(step, None, f"must be a mapping of field names to tensors (a micro-batch as the loader "
                                         f"yields it), got {_kind(batch)}")
    for name in (*TOKEN_FIELDS, *GRIDS, *GRIDS.values(), CU_SEQLENS, CU_SEQLENS_UNPADDED):
        value = batch.get(name)
        if value is not None and not isinstance(value, torch.Tensor):
            raise MimoBatchError(step, name, f"{name} must be a torch.Tensor, got {_kind(value)} (torch.as_tensor converts it)")
    if not any(batch.get(name) is not None for name in (*TOKEN_FIELDS, *GRIDS, *GRIDS.values())):
        raise MimoBatchError(step, None, f"holds none of the fields mimo_batch reads ({', '.join((*TOKEN_FIELDS, *GRIDS.values()))}): "
                                         f"an empty micro-batch, or one of other names; got {sorted(map(str, batch)) or 'no key'}")
    _check_tokens(batch, step, settings)
    _check_loss_mask(batch.get("loss_mask"), step)
    _check_vision(batch, step, settings)
    _check_packing(batch, step)
    _check_video_setting(batch, step, settings)


def _check_tokens(batch: Mapping[str, Any], step: object, settings: MimoBatchSettings) -> None:
    # [B, S] comes from input_ids; a micro-batch without them (an encoder module's) from its first token field.
    first = next((name for name in TOKEN_FIELDS[:4] if batch.get(name) is not None), None)
    if first is None:
        return
    ids = batch[first]
    if ids.dim() != 2:
        raise MimoBatchError(step, first, f"{first} must be [B, S] (rows, tokens), got shape {tuple(ids.shape)}")
    rows, length = ids.shape
    dtypes = {"input_ids": (wide_integer, "int32 or int64"), "labels": (wide_integer, "int32 or int64"),
              "attention_mask": (_integer_or_bool, "integer or bool"), "loss_mask": (_real, "real or bool"),
              POSITION_IDS: (wide_integer, "int32 or int64")}
    for name in TOKEN_FIELDS:
        value = batch.get(name)
        if value is None or (name == POSITION_IDS and settings.mrope):  # M-RoPE ids are computed, not read
            continue
        accepted, words = dtypes[name]
        if not accepted(value.dtype):
            raise MimoBatchError(step, name, f"{name} must be {words}, got {value.dtype}")
        shapes = [(rows, length)]
        if name == POSITION_IDS:
            shapes += [(rows, MROPE_ROWS, length), (MROPE_ROWS, rows, length)]
        if tuple(value.shape) not in shapes:
            allowed = " or ".join(str(list(shape)) for shape in shapes)
            raise MimoBatchError(step, name, f"{name} has shape {tuple(value.shape)}, but {first} is {[rows, length]}: "
                                             f"it must be {allowed}")


def _check_loss_mask(mask: torch.Tensor | None, step: object) -> None:
    """A token's loss weight: 0 (not trained) to 1; a 3.5 or a negative weight is a mask built wrong."""
    if mask is None or mask.numel() == 0:
        return
    low, high = float(mask.min()), float(mask.max())
    if not (0 <= low and high <= 1):
        bad = low if not 0 <= low else high
        raise MimoBatchError(step, "loss_mask", f"loss_mask must hold weights from 0 (not trained) to 1, got {bad}")


def _check_vision(batch: Mapping[str, Any], step: object, settings: MimoBatchSettings) -> None:
    merge = settings.spatial_merge_size
    for grid_name, patches_name in GRIDS.items():
        grid, patches = batch.get(grid_name), batch.get(patches_name)
        if patches is not None and (problem := patches_dtype_problem(patches)) is not None:
            raise MimoBatchError(step, patches_name, f"{patches_name} {problem}")
        if grid is None:
            continue
        if (problem := grid_problem(grid, grid_name)) is not None:
            raise MimoBatchError(step, grid_name, f"{grid_name} {problem}")
        unmerged = next((row for row in grid.tolist() if row[1] % merge or row[2] % merge), None)
        if unmerged is not None:
            raise MimoBatchError(step, grid_name, f"{grid_name} has the row {unmerged}, whose h and w are not multiples of "
                                                  f"spatial_merge_size {merge}")
        if patches is None:
            continue
        if patches.dim() != 2:
            raise MimoBatchError(step, patches_name, f"{patches_name} must be [patches, patch dim] beside {grid_name}, got "
                                                     f"shape {tuple(patches.shape)}")
        if (problem := patch_rows_problem(grid, patches, patches_name, "the micro-batch")) is not None:
            raise MimoBatchError(step, grid_name, f"{grid_name} {problem}")


def _check_packing(batch: Mapping[str, Any], step: object) -> None:
    if batch.get(CU_SEQLENS) is None:
        return
    missing = [name for name in (CU_SEQLENS_UNPADDED, MAX_SEQLEN) if batch.get(name) is None]
    if missing:
        raise MimoBatchError(step, missing[0], f"{missing[0]} is missing: a packed micro-batch (it has cu_seqlens) needs it")
    ends = {}
    for name in (CU_SEQLENS, CU_SEQLENS_UNPADDED):
        value = batch[name]
        if value.dim() != 1 or value.numel() < 1 or not _integer(value.dtype):
            raise MimoBatchError(step, name, f"{name} must be an integer [sequences + 1] tensor, got {value.dtype} of shape {tuple(value.shape)}")
        ends[name] = value.tolist()
        if ends[name][0] != 0 or any(b < a for a, b in zip(ends[name], ends[name][1:])):
            raise MimoBatchError(step, name, f"{name} must start at 0 and never decrease, got {ends[name]}")
    padded, real = ends[CU_SEQLENS], ends[CU_SEQLENS_UNPADDED]
    if len(padded) != len(real):
        raise MimoBatchError(step, CU_SEQLENS_UNPADDED, f"{CU_SEQLENS_UNPADDED} has {len(real)} entries but {CU_SEQLENS} {len(padded)}")
    widths = [b - a for a, b in zip(padded, padded[1:])]
    if any(b - a > width for a, b, width in zip(real, real[1:], widths)):
        raise MimoBatchError(step, CU_SEQLENS_UNPADDED, f"{CU_SEQLENS_UNPADDED} {real} has a sequence longer than its "
                                                        f"padded length in {CU_SEQLENS} {padded}")
    ids = batch.get("input_ids")
    if ids is not None and (ids.shape[0] != 1 or ids.shape[1] != padded[-1]):
        raise MimoBatchError(step, "input_ids", f"input_ids must be one row of {padded[-1]} tokens in a packed micro-batch "
                                                f"(cu_seqlens ends at {padded[-1]}), got shape {tuple(ids.shape)}")
    longest = batch[MAX_SEQLEN]
    longest = int(longest) if isinstance(longest, torch.Tensor) and longest.dim() == 0 and _integer(longest.dtype) else longest
    if not is_integer(longest) or longest < max(widths, default=0):
        raise MimoBatchError(step, MAX_SEQLEN, f"{MAX_SEQLEN} must be an integer at least the longest padded sequence "
                                               f"({max(widths, default=0)}), got {longest!r}")


def _check_video_setting(batch: Mapping[str, Any], step: object, settings: MimoBatchSettings) -> None:
    """Videos are found in ``input_ids`` by ``video_token_id``, which the default settings leave None (the
    built-in processor has no videos): say which setting to set instead of a mismatch of counts."""
    grid, ids = batch.get("video_grid_thw"), batch.get("input_ids")
    if settings.video_token_id is not None or grid is None or grid.shape[0] == 0 or ids is None:
        return
    images = batch.get("pixel_values")
    ordered = settings.encodes and settings.video_modality is None and batch.get("pixel_values_videos") is not None \
        and images is not None and images.shape[0] > 0
    if settings.mrope or ordered:
        need = "M-RoPE positions" if settings.mrope else "ordering videos among images for one encoder"
        raise MimoBatchError(step, "video_grid_thw", f"video_grid_thw holds {grid.shape[0]} videos but video_token_id is None, "
                                                     f"so {need} cannot find their placeholders in input_ids: pass video_token_id= "
                                                     "(the tokenizer's video placeholder id), or settings=MimoBatchSettings"
                                                     ".for_processor(processor), which takes it from the processor")


def _integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _integer_or_bool(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def _real(dtype: torch.dtype) -> bool:
    return not dtype.is_complex


def _kind(value: object) -> str:
    kind = type(value)
    return f"a {kind.__qualname__}" if kind.__module__ == "builtins" else f"a {kind.__module__}.{kind.__qualname__}"
