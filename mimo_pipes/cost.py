"""Per-sample cost: exact integers from fields that are identical on every module."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch


def image_token_count(input_ids: Any, image_token_id: int | Iterable[int]) -> int:
    """Vision placeholder tokens (tensor, array or list; any shape): one per merged vision patch, so
    proportional to encoder work. ``image_token_id``: one id, or several (image and video placeholders)."""
    ids = [image_token_id] if isinstance(image_token_id, (int, np.integer)) else list(image_token_id)
    if isinstance(input_ids, torch.Tensor):
        return int(torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype)).sum())
    return int(np.count_nonzero(np.isin(np.asarray(input_ids), ids)))


def real_token_count(attention_mask: torch.Tensor) -> int:
    """Real (unpadded) tokens; never the padded length, which differs with --seq-length."""
    return int(attention_mask.sum())


def sample_cost(
    image_tokens: int, real_tokens: int, encoder_weight: int, language_weight: int, language_square_weight: int = 0
) -> int:
    """``w_enc * image_tokens + w_lang * real_tokens + w_sq * real_tokens**2`` with integer weights (see
    ReorderConfig). The square term is attention under sequence packing: a packed rank's language time
    grows with the sum of its sequences' squared lengths, and that sum adds up sample by sample."""
    return encoder_weight * image_tokens + language_weight * real_tokens + language_square_weight * real_tokens**2
