"""mimo_batch: a micro-batch as the loader yields it, as the keyword arguments of megatron-core's ``MimoModel.forward``.

What comes out (``B`` rows of ``S`` tokens; a packed micro-batch is one row of ``T`` tokens):

==================  ===========================================  ===================================
key                 value                                        where from
==================  ===========================================  ===================================
``input_ids``       int64 ``[B, S]``                             ``input_ids``
``position_ids``    int64 ``[3, B, S]`` (M-RoPE) or ``[B, S]``   computed (``mrope``), or kept
``attention_mask``  None, or bool ``[B, 1, S, S]`` True=masked   ``attention_mask`` (the padding)
``loss_mask``       float ``[B, S]``, 0 on padding               ``loss_mask``
``labels``          int64 ``[B, S]``, -100 on padding            ``labels``
``modality_inputs`` ``{modality: {encoder_key: {pixels_key:      ``pixel_values`` (+ videos),
                    [patches, dim], grid_key: [items, 3]}}}``    ``image_grid_thw`` (+ videos)
                    or None
``packing_kwargs``  None, or the THD parameters                  ``cu_seqlens``, ... (packing.py)
==================  ===========================================  ===================================

What each field must be is checked first (:mod:`mimo_pipes.megatron.inputs`). A key the micro-batch lacks
is None (an encoder module's micro-batches hold no token field but ``input_ids``, a language module's no
pixels). Every other key is dropped: the metadata lists (``sample_ids``,
``read_steps``, ``slots``, ``image_tokens``, ``real_tokens``, ``costs``), ``step``, ``vision_rows``,
the packing fields once they are ``packing_kwargs``, and keys rows pass through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mimo_pipes.megatron.inputs import MimoBatchError, check_microbatch, step_of
from mimo_pipes.megatron.packing import is_packed, packing_kwargs
from mimo_pipes.megatron.rope import mrope_position_ids
from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.megatron.stages import for_stage
from mimo_pipes.megatron.vision import merged_vision
from mimo_pipes.samples.mrope_layout import MROPE_ROWS, POSITION_IDS, to_mrope_first
from mimo_pipes.samples.thd import CU_SEQLENS, CU_SEQLENS_UNPADDED

FORWARD_KEYS = ("input_ids", "position_ids", "attention_mask", "loss_mask", "labels", "modality_inputs", "packing_kwargs")
DEFAULT_SETTINGS = MimoBatchSettings()


def mimo_batch(micro_batch: Mapping[str, Any], settings: MimoBatchSettings | None = None, **options: Any) -> dict[str, Any]:
    """The keyword arguments of ``MimoModel.forward`` for one micro-batch (see the module doc).

    ``settings`` (default: the built-in processor's, see :class:`MimoBatchSettings`) with ``options``
    overriding its fields by name. Tensors stay on the micro-batch's device; the micro-batch is not
    modified. Raises :class:`~mimo_pipes.megatron.inputs.MimoBatchError` (a ValueError), one line naming the
    micro-batch and the field, for a micro-batch it refuses: a malformed field, or placeholders and grids
    that disagree."""
    settings = (settings or DEFAULT_SETTINGS).with_options(**options) if options else (settings or DEFAULT_SETTINGS)
    check_microbatch(micro_batch, settings)
    packed = is_packed(micro_batch)
    input_ids = micro_batch.get("input_ids")
    mask = None if packed else micro_batch.get("attention_mask")
    try:
        kwargs = {
            "input_ids": input_ids,
            "position_ids": _position_ids(micro_batch, settings, packed),
            "attention_mask": _attention_mask(mask, settings) if not packed else None,
            "loss_mask": _float_mask(micro_batch.get("loss_mask")),
            "labels": micro_batch.get("labels"),
            "modality_inputs": _modality_inputs(micro_batch, settings, mask, packed),
            "packing_kwargs": packing_kwargs(micro_batch),
        }
    except ValueError as e:  # placeholders and grids that disagree: the inner message is the whole story
        raise MimoBatchError(step_of(micro_batch), None, str(e)) from None
    return for_stage(kwargs, settings.stage)


def _position_ids(batch: Mapping[str, Any], settings: MimoBatchSettings, packed: bool) -> torch.Tensor | None:
    input_ids = batch.get("input_ids")
    if settings.mrope and input_ids is not None:
        return mrope_position_ids(
            input_ids,
            image_token_id=settings.image_token_id,
            video_token_id=settings.video_token_id,
            image_grid_thw=batch.get("image_grid_thw"),
            video_grid_thw=batch.get("video_grid_thw"),
            spatial_merge_size=settings.spatial_merge_size,
            attention_mask=None if packed else batch.get("attention_mask"),
            cu_seqlens=batch.get(CU_SEQLENS) if packed else None,
            cu_seqlens_unpadded=batch.get(CU_SEQLENS_UNPADDED) if packed else None,
            video_intervals=settings.video_intervals,
            split_video_frames=settings.mrope_family == "qwen3-vl",
        )
    positions = batch.get(POSITION_IDS)
    if isinstance(positions, torch.Tensor) and positions.dim() == 3 and positions.shape[1] == MROPE_ROWS:
        return to_mrope_first(positions)  # the pipeline's [B, 3, S]; [3, B, S] (B != 3) is Megatron's already
    return positions


def _float_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``loss_mask`` as the float weights megatron-core multiplies the losses by (a bool or integer mask as float32)."""
    return mask if mask is None or mask.is_floating_point() else mask.to(torch.float32)


def _attention_mask(mask: torch.Tensor | None, settings: MimoBatchSettings) -> torch.Tensor | None:
    if settings.attention_mask == "none" or mask is None:
        return None
    length = mask.shape[-1]
    later = torch.ones((length, length), dtype=torch.bool, device=mask.device).triu(1)
    padding = ~mask.bool()
    return later[None, None] | padding[:, None, None, :]


def _modality_inputs(batch: Mapping[str, Any], settings: MimoBatchSettings, mask: torch.Tensor | None, packed: bool) -> dict | None:
    if not settings.encodes:
        return None
    images = _pair(batch, "pixel_values", "image_grid_thw")
    videos = _pair(batch, "pixel_values_videos", "video_grid_thw")
    if settings.video_modality is not None:  # each kind its own modality: no ordering across kinds
        entries = {settings.modality: merged_vision(images, None, input_ids=None, image_token_id=None, video_token_id=None,
                                                    spatial_merge_size=settings.spatial_merge_size),
                   settings.video_modality: merged_vision(None, videos, input_ids=None, image_token_id=None, video_token_id=None,
                                                          spatial_merge_size=settings.spatial_merge_size)}
    else:
        entries = {settings.modality: merged_vision(
            images, videos, input_ids=batch.get("input_ids"), image_token_id=settings.image_token_id,
            video_token_id=settings.video_token_id, spatial_merge_size=settings.spatial_merge_size, token_mask=mask,
        )}
    inputs = {
        modality: {settings.encoder_key: {settings.pixels_key: pair[0], settings.grid_key: pair[1]}}
        for modality, pair in entries.items() if pair is not None
    }
    return inputs or None


def _pair(batch: Mapping[str, Any], pixels: str, grid: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    if batch.get(pixels) is None:
        return None
    if batch.get(grid) is None:
        raise ValueError(f"{pixels} without {grid}: a Qwen2-VL-style encoder needs each item's grid (tiled images, "
                         "InternVL's image_num_tiles, have none: pass encodes=False, mrope=False and build their encoder inputs)")
    return batch[pixels], batch[grid]
