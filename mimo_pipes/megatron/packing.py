"""``packing_kwargs`` of ``MimoModel.forward`` from a micro-batch the pipeline packed (THD, see mimo_pipes/samples/thd.py).

megatron-core builds its ``PackedSeqParams`` (``qkv_format="thd"``) from them: ``cu_seqlens_q`` /
``cu_seqlens_kv`` are the cumulative real lengths (the pipeline's ``cu_seqlens_unpadded``),
``cu_seqlens_q_padded`` / ``cu_seqlens_kv_padded`` where each sequence starts with its padding to the
pack multiple (the pipeline's ``cu_seqlens``), ``max_seqlen_q`` / ``max_seqlen_kv`` the longest padded
sequence (the pipeline's ``max_seqlen``). With a pack multiple of 1 the padded and real forms are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mimo_pipes.samples.thd import CU_SEQLENS, CU_SEQLENS_UNPADDED, MAX_SEQLEN

PACKED_KEYS = (CU_SEQLENS, CU_SEQLENS_UNPADDED, MAX_SEQLEN)


def is_packed(batch: Mapping[str, Any]) -> bool:
    return CU_SEQLENS in batch


def packing_kwargs(batch: Mapping[str, Any]) -> dict[str, Any] | None:
    """The packing parameters of a packed micro-batch; None for a padded one."""
    if not is_packed(batch):
        return None
    missing = [key for key in PACKED_KEYS if key not in batch]
    if missing:
        raise ValueError(f"micro-batch {batch.get('step')}: a packed micro-batch needs {', '.join(missing)}")
    padded = batch[CU_SEQLENS].to(torch.int32)
    real = batch[CU_SEQLENS_UNPADDED].to(torch.int32)
    longest = int(batch[MAX_SEQLEN])
    return {
        "cu_seqlens_q": real,
        "cu_seqlens_kv": real.clone(),
        "cu_seqlens_q_padded": padded,
        "cu_seqlens_kv_padded": padded.clone(),
        "max_seqlen_q": longest,
        "max_seqlen_kv": longest,
    }
