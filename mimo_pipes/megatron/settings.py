"""How :func:`~mimo_pipes.megatron.batch.mimo_batch` shapes a micro-batch for ``MimoModel.forward``: one frozen
record, its defaults those of the built-in processor and of Megatron-Bridge's Qwen-VL MIMO step."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from mimo_pipes.config.counts import as_count
from mimo_pipes.data.embedded.builtin_processor import IMAGE_PAD, MERGE_SIZE, SPECIAL_TOKENS
from mimo_pipes.data.processing.families import FRAME_RATE
from mimo_pipes.megatron.stages import ONLY, STAGES

ATTENTION_MASKS = ("none", "bool")
"""``none``: no mask (causal attention; right padding comes after every real token). ``bool``: a
``[B, 1, S, S]`` mask, True where a query may not attend (a later token or a padding token)."""
MROPE_FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")
"""How video temporal positions step (images are the same in all three; see :mod:`mimo_pipes.megatron.rope`)."""


@dataclass(frozen=True)
class MimoBatchSettings:
    """Options of :func:`~mimo_pipes.megatron.batch.mimo_batch` (each also a keyword of it).

    * ``modality`` / ``encoder_key``: where the vision fields go, ``modality_inputs[modality][encoder_key]``
      (Megatron-Bridge's Qwen-VL MIMO names: ``images`` / ``qwen_visual``).
    * ``pixels_key`` / ``grid_key``: the encoder's keyword for the patch rows and for the grids.
    * ``image_token_id``, ``video_token_id``, ``spatial_merge_size``: the placeholder tokens and the
      merge of the vision tower (defaults: the built-in processor's; :meth:`for_processor` takes a loaded
      processor's). ``video_token_id`` None: the tokenizer has no video placeholder.
    * ``mrope``: compute M-RoPE position ids ``[3, B, S]`` from ``input_ids`` and the grids; false keeps
      the micro-batch's ``position_ids`` (``[B, S]``, or ``[B, 3, S]`` moved to ``[3, B, S]``).
      ``mrope_family``, ``tokens_per_second``, ``seconds_per_video_grid``: video temporal steps.
    * ``stage``: the rank's pipeline stage of the language model (:mod:`mimo_pipes.megatron.stages`).
    * ``attention_mask``: ``none`` or ``bool`` (see ``ATTENTION_MASKS``); a packed micro-batch has none.
    * ``video_modality``: None puts videos with the images, in the order their placeholders appear (one
      tower encodes both, as Megatron-Bridge's Qwen-VL step does); a name gives them their own entry,
      ``modality_inputs[video_modality][encoder_key]`` (a MIMO model with a modality per placeholder token).
    * ``encodes``: False never gives ``modality_inputs`` (a rank whose module does not encode); True gives
      them wherever the micro-batch has pixels.
    """

    modality: str = "images"
    encoder_key: str = "qwen_visual"
    pixels_key: str = "hidden_states"
    grid_key: str = "grid_thw"
    image_token_id: int | None = SPECIAL_TOKENS.index(IMAGE_PAD)
    video_token_id: int | None = None
    spatial_merge_size: int = MERGE_SIZE
    mrope: bool = True
    mrope_family: str = "qwen2-vl"
    tokens_per_second: float = 2.0
    seconds_per_video_grid: float = 1.0
    stage: str = ONLY
    attention_mask: str = "none"
    video_modality: str | None = None
    encodes: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("stage", STAGES), ("attention_mask", ATTENTION_MASKS), ("mrope_family", MROPE_FAMILIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"mimo_batch: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        # Ids and sizes as plain ints (numpy and torch integers too); a string, float or bool is refused here, not
        # taken to match no token and blamed on the tokenizer later.
        for name, minimum in (("image_token_id", 0), ("video_token_id", 0), ("spatial_merge_size", 1)):
            value = getattr(self, name)
            if value is not None or name == "spatial_merge_size":
                object.__setattr__(self, name, as_count(value, f"mimo_batch: {name}", minimum=minimum))
        for name in ("tokens_per_second", "seconds_per_video_grid"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"mimo_batch: {name} must be a positive number, got {value!r}")
        for name in ("mrope", "encodes"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"mimo_batch: {name} must be True or False, got {getattr(self, name)!r}")
        if self.mrope and self.image_token_id is None and self.video_token_id is None:
            raise ValueError("mimo_batch: mrope needs image_token_id or video_token_id")

    @classmethod
    def for_processor(cls, processor: Any, **options: Any) -> MimoBatchSettings:
        """Settings with the placeholder ids, merge size and M-RoPE family of a loaded
        :class:`~mimo_pipes.data.processing.processor.SampleProcessor` (any Qwen2/2.5/3-VL folder), then ``options``.

        The family is the release the folder names (``processor_class`` and the rest, see
        :mod:`~mimo_pipes.data.processing.family_names`). A folder that names none, with a video placeholder, is
        refused unless ``mrope_family`` (or ``mrope=False``) is given: the releases step video time differently.
        A tile family (InternVL) has no M-RoPE: ``mrope`` False keeps the micro-batch's ``position_ids``."""
        family = processor.family
        found = {
            "image_token_id": family.image_token_id,
            "video_token_id": family.video_token_id,
            "spatial_merge_size": int(getattr(family, "merge_size", 1)),
        }
        if not hasattr(family, "release"):  # tiles (InternVL): one position per token, no grids to place images by
            found["mrope"] = False
        release = getattr(family, "release", None)
        if release is not None:
            found["mrope_family"] = release
            if release == "qwen2.5-vl":  # Qwen2_5_VLProcessor's temporal_patch_size / fps, frames as the processor takes them
                found["seconds_per_video_grid"] = family.temporal_patch_size / FRAME_RATE
        elif family.video_token_id is not None and options.get("mrope", True) and "mrope_family" not in options:
            raise ValueError(
                f"mimo_batch: the processor folder {getattr(processor, 'source', None)!r} does not say which Qwen-VL release it "
                f"is (no processor_class, video_processor_type or model_type naming one), and video positions differ "
                f"between them: pass mrope_family= ({', '.join(MROPE_FAMILIES)})"
            )
        return cls(**{**found, **options})

    def with_options(self, **options: Any) -> MimoBatchSettings:
        names = {f.name for f in fields(self)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"mimo_batch: unknown option(s) {', '.join(unknown)}; options are {', '.join(sorted(names))}")
        return replace(self, **options)

    @property
    def video_intervals(self) -> float:
        """Temporal position step of a video grid row (see :mod:`mimo_pipes.megatron.rope`)."""
        return self.tokens_per_second * self.seconds_per_video_grid if self.mrope_family == "qwen2.5-vl" else 1.0
