"""Inputs shared by the megatron tests: real micro-batches of the built-in processor, and transformers' own
M-RoPE as the reference."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP

IMAGE, VIDEO, START, END = 5, 6, 3, 4  # the built-in tokenizer's <|image_pad|>, <|vision_start|>, <|vision_end|>; 6 for videos
MERGE = 2


def reference(family: str, input_ids, *, image_grid_thw=None, video_grid_thw=None, attention_mask=None, tokens_per_second=2.0, seconds=None,
              image_token_id=IMAGE, video_token_id=VIDEO):
    """transformers' get_rope_index of the family, called on a stand-in holding only the config it reads."""
    if family == "qwen2-vl":
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel as model
    elif family == "qwen2.5-vl":
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as model
    else:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel as model
    vision = SimpleNamespace(spatial_merge_size=MERGE, tokens_per_second=tokens_per_second)
    stand_in = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    stand_in.get_vision_position_ids = lambda *a, **k: model.get_vision_position_ids(stand_in, *a, **k)
    types = (input_ids == image_token_id).int() + 2 * (input_ids == video_token_id).int()
    extra = {"second_per_grid_ts": seconds} if family == "qwen2.5-vl" and seconds is not None else {}
    grids = {name: None if g is None else g.clone() for name, g in (("image_grid_thw", image_grid_thw), ("video_grid_thw", video_grid_thw))}
    positions, _ = model.get_rope_index(stand_in, input_ids, types, attention_mask=attention_mask, **grids, **extra)
    return positions


def image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)


ROWS = {
    "text only": dict(prompt="what is a box?", response="a thing with six sides"),
    "one image": dict(prompt="describe it", response="a drawing", images=[image(60, 90)]),
    "several images": dict(prompt="compare", response="the first is taller", images=[image(40, 40, 1), image(130, 60, 2), image(56, 200, 3)]),
    "one wide image": dict(prompt="and this?", response="a banner", images=[image(30, 300, 4)]),
}


def microbatch(processor, names, pad_length=None, rows=None):
    """The rows named (of ``rows``, default ``ROWS``) processed and collated as one micro-batch."""
    rows = ROWS if rows is None else rows
    samples = []
    for i, name in enumerate(names):
        sample = processor(rows[name])
        sample.update({SAMPLE_ID: i, STEP: 0, SLOT: i})
        samples.append(sample)
    return collate_microbatch(samples, pad_length=pad_length, vision_fields=processor.vision_fields)


def truncates_video_seconds() -> bool:
    """transformers before 5.18 cut Qwen2.5-VL's seconds per video grid to whole seconds (``int(...)``; a float
    ``tokens_per_second`` then fails in its ``meshgrid``): its positions for fractional seconds are not the model's."""
    import transformers

    from mimo_pipes.megatron.forward import release

    return release(transformers.__version__) < (5, 18)
