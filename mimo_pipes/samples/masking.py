"""Masked samples: a row that failed after the exchange stays in its micro-batch but teaches nothing.

Under the ``rows`` payload with ``--skip-bad-samples``, a row whose image cannot be decoded on the rank that
processes it cannot be replaced by another row any more (every module has already counted, balanced and
moved it). Every module keeps the sample where it is, with the shapes its cost was counted for: the rank
that failed stands in blank pixels of the header's size, and every module's copy has its labels ignored
(``-100``, ``loss_mask`` 0), so the loss never sees it, the micro-batches keep their balance, and the
language side's image tokens still match the encoder's output. ``masked`` names why on every copy.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mimo_pipes.samples.sample import SAMPLE_ID, STEP, Sample

MASKED = "masked"
"""Sample key under ``--skip-bad-samples`` with the ``rows`` payload: why the sample is masked (one line),
None when it is not. Collated as a list per micro-batch."""
IGNORED_LABEL = -100


def masked(sample: Sample, reason: str) -> Sample:
    """``sample`` with every label ignored and ``reason`` under :data:`MASKED` (a new dict, tensors copied
    where changed)."""
    out = dict(sample)
    if isinstance(out.get("labels"), torch.Tensor):
        out["labels"] = torch.full_like(out["labels"], IGNORED_LABEL)
    if isinstance(out.get("loss_mask"), torch.Tensor):
        out["loss_mask"] = torch.zeros_like(out["loss_mask"])
    out[MASKED] = reason
    return out


def mask_failed(microbatches: list[list[Sample]], reasons: Mapping[tuple[int, int], str]) -> int:
    """Masks, in place, every sample of ``microbatches`` whose (read step, sample id) is in ``reasons``
    (with its reason), and marks every other one unmasked (None); returns how many it masked."""
    count = 0
    for microbatch in microbatches:
        for position, sample in enumerate(microbatch):
            why = reasons.get((sample.get(STEP), sample.get(SAMPLE_ID)))
            if why is None:
                microbatch[position] = {**sample, MASKED: None}
            else:
                microbatch[position] = masked(sample, why)
                count += 1
    return count
