"""Sequence packing (THD layout) of one collated micro-batch: pure tensor arithmetic, no graph, no collectives.

A collated micro-batch holds ``b`` right-padded rows of length ``L``. Packing concatenates each row's real
tokens into one row of ``T`` tokens, the layout Megatron's ``qkv_format="thd"`` and flash-attention's
varlen kernels take, and describes where each sequence sits:

* token fields (every tensor shaped ``[b, L]``, or ``[b, 3, L]`` for M-RoPE position ids) become
  ``[1, T]`` / ``[1, 3, T]``: Megatron's packed-sequence convention keeps a batch dimension of 1;
* ``cu_seqlens`` (int32, ``[b + 1]``): where each sequence starts in the packed row, its padding
  included (Megatron's ``cu_seqlens_q_padded``); ``cu_seqlens_unpadded`` (int32): cumulative real
  lengths (``cu_seqlens_q``); ``max_seqlen`` (int): the longest padded sequence. With a pad multiple
  of 1 the two ``cu_seqlens`` are equal;
* with ``pad_multiple`` k > 1, each sequence is padded on its right to a multiple of k (context
  parallelism splits every sequence into 2 x cp chunks); padding tokens carry the field's pad value
  (``labels`` -100, ``loss_mask`` 0, ...), so they never enter the loss;
* ``attention_mask`` is dropped: the kernels take the sequence boundaries from ``cu_seqlens``;
* position ids are kept as they are, cut per sequence (the processors' restart at 0 in every sample;
  a three-row M-RoPE field keeps its three rows); a batch without them gets ``arange`` per sequence;
* everything else (``pixel_values``, ``image_grid_thw`` and other vision fields, per-sample tensors and
  lists, metadata lists, ``step``) passes through unchanged, in sample order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mimo_pipes.errors import SampleError, as_count
from mimo_pipes.samples.collate import CONCAT_FIELDS, DEFAULT_PAD_VALUES
from mimo_pipes.samples.mrope_layout import MROPE_ROWS, POSITION_IDS, is_rows_first

CU_SEQLENS = "cu_seqlens"
CU_SEQLENS_UNPADDED = "cu_seqlens_unpadded"
MAX_SEQLEN = "max_seqlen"
ATTENTION_MASK = "attention_mask"


def token_fields(batch: Mapping[str, Any]) -> list[str]:
    """Names of the per-token fields: tensors shaped ``[b, L]`` or ``[b, 3, L]`` with ``b, L`` of
    ``attention_mask``. Ragged vision fields are never token fields, whatever their shape."""
    rows, length = _mask(batch).shape
    names = []
    for name, value in batch.items():
        if name in CONCAT_FIELDS or not isinstance(value, torch.Tensor):
            continue
        if tuple(value.shape) == (rows, length) or is_rows_first(value, rows, length):
            names.append(name)
    return names


def sequence_lengths(batch: Mapping[str, Any]) -> list[int]:
    """Real tokens of each row: its ``attention_mask`` must be ones then zeros (right padding)."""
    mask = _mask(batch)
    lengths = [int(n) for n in (mask != 0).sum(dim=1)]
    for row, n in enumerate(lengths):
        if not bool((mask[row, :n] != 0).all()) or bool((mask[row, n:] != 0).any()):
            sample_id = _sample_id(batch, row)
            raise SampleError(sample_id, "sequence packing needs right-padded rows (ones, then zeros)", field=ATTENTION_MASK)
    return lengths


def check_pad_multiple(pad_multiple: object) -> int:
    """``pad_multiple`` as an int >= 1 (numpy and torch integers too); ConfigError (a ValueError) naming it otherwise."""
    return as_count(pad_multiple, "pad_multiple", minimum=1)


def padded_length(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple``."""
    return -(-length // multiple) * multiple


def cumulative(lengths: Sequence[int]) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32, the form varlen kernels take."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), dim=0).to(torch.int32)
    return out


def pack_microbatch(
    batch: Mapping[str, Any], *, pad_multiple: int = 1, pad_values: Mapping[str, int | float] = DEFAULT_PAD_VALUES
) -> dict[str, Any]:
    """The THD form of one collated micro-batch (see the module docstring); ``batch`` is not modified."""
    pad_multiple = check_pad_multiple(pad_multiple)
    lengths = sequence_lengths(batch)
    padded = [padded_length(n, pad_multiple) for n in lengths]
    starts = cumulative(padded)
    total = int(starts[-1])
    names = token_fields(batch)
    packed: dict[str, Any] = {}
    for name, value in batch.items():
        if name == ATTENTION_MASK:
            continue
        packed[name] = _pack_field(value, lengths, starts, total, pad_values.get(name, 0)) if name in names else value
    if POSITION_IDS not in packed:
        positions = torch.zeros((1, total), dtype=torch.int64)
        for start, n in zip(starts.tolist(), lengths):
            positions[0, start : start + n] = torch.arange(n)
        packed[POSITION_IDS] = positions
    packed[CU_SEQLENS] = starts
    packed[CU_SEQLENS_UNPADDED] = cumulative(lengths)
    packed[MAX_SEQLEN] = max(padded, default=0)
    return packed


def unpack_sequences(packed: Mapping[str, Any]) -> list[dict[str, torch.Tensor]]:
    """Each sample's real tokens of every token field of a packed micro-batch, in sample order."""
    starts, ends = packed[CU_SEQLENS][:-1].tolist(), packed[CU_SEQLENS_UNPADDED]
    lengths = (ends[1:] - ends[:-1]).tolist()
    total = int(packed[CU_SEQLENS][-1])
    names = [
        name for name, value in packed.items()
        if isinstance(value, torch.Tensor) and name not in CONCAT_FIELDS and value.dim() in (2, 3)
        and value.shape[0] == 1 and value.shape[-1] == total and (value.dim() == 2 or value.shape[1] == MROPE_ROWS)
    ]
    return [{name: packed[name][0, ..., start : start + n] for name in names} for start, n in zip(starts, lengths)]


@dataclass(frozen=True)
class PackingMetrics:
    """Token counts of one micro-batch, padded against packed."""

    rows: int
    padded_length: int  # L of the collated micro-batch
    real_tokens: int
    packed_tokens: int  # T: tokens in the packed row, per-sequence padding included

    @property
    def padding_fraction_before(self) -> float:
        slots = self.rows * self.padded_length
        return 1 - self.real_tokens / slots if slots else 0.0

    @property
    def padding_fraction_after(self) -> float:
        return 1 - self.real_tokens / self.packed_tokens if self.packed_tokens else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "rows": self.rows,
            "padded_length": self.padded_length,
            "real_tokens": self.real_tokens,
            "tokens_per_packed_row": self.packed_tokens,
            "padding_fraction_before": self.padding_fraction_before,
            "padding_fraction_after": self.padding_fraction_after,
        }


def packing_metrics(batch: Mapping[str, Any], packed: Mapping[str, Any]) -> PackingMetrics:
    """Counts for a collated micro-batch and its packed form."""
    rows, length = _mask(batch).shape
    cu = packed[CU_SEQLENS_UNPADDED]
    return PackingMetrics(rows=rows, padded_length=length, real_tokens=int(cu[-1]), packed_tokens=int(packed[CU_SEQLENS][-1]))


def _pack_field(value: torch.Tensor, lengths: list[int], starts: torch.Tensor, total: int, pad_value: int | float) -> torch.Tensor:
    out = torch.full((1, *value.shape[1:-1], total), pad_value, dtype=value.dtype)
    for row, (start, n) in enumerate(zip(starts.tolist(), lengths)):
        out[0, ..., start : start + n] = value[row, ..., :n]
    return out


def _mask(batch: Mapping[str, Any]) -> torch.Tensor:
    mask = batch.get(ATTENTION_MASK)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(
            f"micro-batch {batch.get('step')}: sequence packing needs attention_mask as a [rows, length] tensor "
            "to find each row's real tokens"
        )
    return mask


def _sample_id(batch: Mapping[str, Any], row: int) -> object:
    ids = batch.get("sample_ids")
    return ids[row] if isinstance(ids, list) and row < len(ids) else f"row {row} of micro-batch {batch.get('step')}"
