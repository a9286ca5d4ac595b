"""The M-RoPE layout: where the three rows of Qwen2-VL-style rotary position ids sit in a micro-batch.

M-RoPE rotates each token by three positions (temporal, height, width): ``position_ids`` has three rows.
Inside the pipeline a sample's ids are ``[3, L]`` and a micro-batch's ``[B, 3, L]`` (rows first: every
per-token field is split and padded along its first and last dimensions alike). Megatron's rotary
embedding and transformers' ``get_rope_index`` take ``[3, B, L]`` (M-RoPE rows first). These two
functions are the only places the layout turns.
"""

from __future__ import annotations

import torch

POSITION_IDS = "position_ids"
MROPE_ROWS = 3
"""Temporal, height and width rows of M-RoPE position ids."""


def to_mrope_first(positions: torch.Tensor) -> torch.Tensor:
    """``[B, 3, L]`` as ``[3, B, L]``, contiguous (Megatron's rotary embedding reads it so)."""
    return positions.transpose(0, 1).contiguous()


def to_rows_first(positions: torch.Tensor) -> torch.Tensor:
    """``[3, B, L]`` as ``[B, 3, L]`` (a view: each row is split off next)."""
    return positions.transpose(0, 1)


def is_rows_first(positions: object, rows: int, length: int) -> bool:
    """Whether ``positions`` are a micro-batch's M-RoPE ids in the pipeline's layout, ``[rows, 3, length]``."""
    return isinstance(positions, torch.Tensor) and tuple(positions.shape) == (rows, MROPE_ROWS, length)
