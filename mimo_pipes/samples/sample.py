"""What flows between the graph's nodes: samples (plain dicts, with the metadata keys below) and windows.

A sample is a plain ``dict``: model fields (``input_ids``, ``pixel_values``, ...) as tensors without a
batch dimension, plus the metadata below. Metadata is set by the reader and the cost annotator (or, for a
row that moves before it is processed, by the counting before the exchange) and is identical on every
module for the same sample. A window holds samples, or rows (the dataset's rows with their metadata)
until they are processed after the exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Sample = dict[str, Any]

SAMPLE_ID = "sample_id"  # int: the sample's index in the source dataset
STEP = "step"  # int: global micro-batch the reader read the sample at, from the start of training (kept when it moves)
SLOT = "slot"  # int: canonical slot the reader placed the sample in
IMAGE_TOKENS = "image_tokens"  # int: image placeholder tokens in input_ids
REAL_TOKENS = "real_tokens"  # int: attention_mask sum
ENCODER_COST = "encoder_cost"  # int: image_tokens, or modelled encoder ns with a time model (time_model.py)
COST = "cost"  # int: w_enc * encoder_cost + w_lang * real_tokens, in fixed point
# Set on a row counted before it is processed (rows payload, mimo_pipes/data/processing/row_counter.py):
PLACEHOLDER_RUNS = "placeholder_runs"  # list[int]: its placeholder runs, for the cost (dropped once priced)
TOKEN_LAYOUT = "token_layout"  # dict: its token ids, trained flags and layout fields (the language side's, moved)

METADATA_KEYS = (SAMPLE_ID, STEP, SLOT, IMAGE_TOKENS, REAL_TOKENS, COST, ENCODER_COST, PLACEHOLDER_RUNS, TOKEN_LAYOUT)

# Per-token fields: padded on the right along their last dimension and stacked: [L] -> [b, L], and the
# three-row M-RoPE position ids [3, L] -> [b, 3, L].
SEQUENCE_FIELDS = ("input_ids", "attention_mask", "labels", "loss_mask", "position_ids")
# Ragged vision fields: concatenated along dim 0, as Qwen2-VL-style and tiling encoders take them.
CONCAT_FIELDS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "image_num_tiles")
# Token ids, targets and positions index embeddings and vocabularies: int32 or int64 only (a float cast
# would be truncated silently by the model, or fail far from the sample that carried it).
INTEGER_FIELDS = ("input_ids", "labels", "position_ids")
FieldSpec = tuple[tuple[int, ...], "torch.dtype"]
"""A concatenated field's shape past dim 0 and its dtype: ``((1176,), torch.float32)`` for Qwen2-VL pixels."""


@dataclass
class Window:
    """This rank's samples for global micro-batches ``first_step .. first_step + len(microbatches) - 1``:
    the unit the exchange works on.

    ``microbatches[m]`` lists the rank's samples of step ``first_step + m`` in canonical order; once
    ``collated``, it is instead that step's collated micro-batch (a dict of batched tensors).
    ``composition`` (set by an exchange that lets samples move between micro-batches): per output
    micro-batch, the window's flat indices ``m*B + j`` it holds over all ranks, ascending. It does not
    depend on the layout, so a state saved inside the window keeps it (see MicroBatchAssembler).
    ``record``: what its exchange did (an :class:`~mimo_pipes.observe.observer.ExchangeRecord`), carried to the
    node that hands the window on when that node is not the exchange (row processing), which reports it;
    never compared or saved.
    """

    first_step: int
    microbatches: list[list[Sample]] | list[dict[str, Any]]
    collated: bool = False
    composition: list[list[int]] | None = None
    record: Any = field(default=None, compare=False, repr=False)


def held_bytes(value: Any) -> int:
    """Bytes of the data ``value`` holds: tensors, arrays, bytes and strings, in dicts, lists, tuples and
    windows (for measuring what prefetched windows hold; Python object overheads not counted)."""
    import numpy as np
    import torch

    # A loop over a stack, not recursion: it runs once per exchanged window, over every value of every sample
    # (mostly small ints of the metadata), so a call per value would cost more than the exchange of a small window.
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _NO_DATA:
            continue
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif kind is dict or isinstance(item, dict):
            stack.extend(item.values())
        elif kind is list or isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, np.ndarray):
            total += int(item.nbytes)
        elif isinstance(item, (bytes, bytearray, str)):
            total += len(item)
        elif isinstance(item, Window):
            stack.append(item.microbatches)
    return total


_NO_DATA = frozenset((int, float, bool, type(None)))
