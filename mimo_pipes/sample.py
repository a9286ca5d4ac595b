"""What flows between the graph's nodes: samples (plain dicts, with the metadata keys below) and windows.

A sample is a plain ``dict``: model fields (``input_ids``, ``pixel_values``, ...) as tensors without a
batch dimension, plus the metadata below. Metadata is set by the reader and the cost annotator and is
identical on every module for the same sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Sample = dict[str, Any]

SAMPLE_ID = "sample_id"  # int: the sample's index in the source dataset
STEP = "step"  # int: global micro-batch the reader read the sample at, from the start of training (kept when it moves)
SLOT = "slot"  # int: canonical slot the reader placed the sample in
IMAGE_TOKENS = "image_tokens"  # int: image placeholder tokens in input_ids
REAL_TOKENS = "real_tokens"  # int: attention_mask sum
ENCODER_COST = "encoder_cost"  # int: image_tokens, or modelled encoder ns with a time model (time_model.py)
COST = "cost"  # int: w_enc * encoder_cost + w_lang * real_tokens, in fixed point

METADATA_KEYS = (SAMPLE_ID, STEP, SLOT, IMAGE_TOKENS, REAL_TOKENS, COST, ENCODER_COST)


@dataclass
class Window:
    """This rank's samples for global micro-batches ``first_step .. first_step + len(microbatches) - 1``:
    the unit the exchange works on.

    ``microbatches[m]`` lists the rank's samples of step ``first_step + m`` in canonical order; once
    ``collated``, it is instead that step's collated micro-batch (a dict of batched tensors).
    ``composition`` (set by an exchange that lets samples move between micro-batches): per output
    micro-batch, the window's flat indices ``m*B + j`` it holds over all ranks, ascending. It does not
    depend on the layout, so a state saved inside the window keeps it (see MicroBatchAssembler).
    """

    first_step: int
    microbatches: list[list[Sample]] | list[dict[str, Any]]
    collated: bool = False
    composition: list[list[int]] | None = None
