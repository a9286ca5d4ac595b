"""Which ``MimoModel.forward`` inputs each pipeline stage of the language model takes.

Megatron's pipeline schedules call the forward step on every stage: the first stage embeds the tokens
(``input_ids``, and the vision inputs it splices in), the last computes the loss (``labels``,
``loss_mask``), and a middle stage takes only hidden states from its neighbour. Position ids, the
attention mask and the packing parameters are needed on every stage (rotary embeddings and attention run
in every layer). Keys a stage does not take are set to None, as Megatron-Bridge's MIMO step does, so the
keyword arguments are the same on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mimo_pipes.config.counts import as_count

STAGES = ("only", "first", "middle", "last")
"""A rank's pipeline stage in the language model: ``only`` (no pipeline parallelism) keeps every key."""
ONLY, FIRST, MIDDLE, LAST = STAGES
FIRST_STAGE_KEYS = ("input_ids", "modality_inputs")
LAST_STAGE_KEYS = ("labels", "loss_mask")


def stage_keys(stage: str) -> tuple[str, ...]:
    """The keys set to None on ``stage`` (one of ``STAGES``)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    dropped: tuple[str, ...] = ()
    if stage in (MIDDLE, LAST):
        dropped += FIRST_STAGE_KEYS
    if stage in (FIRST, MIDDLE):
        dropped += LAST_STAGE_KEYS
    return dropped


def for_stage(kwargs: Mapping[str, Any], stage: str) -> dict[str, Any]:
    """``kwargs`` with the keys ``stage`` does not take set to None."""
    dropped = stage_keys(stage)
    return {key: (None if key in dropped else value) for key, value in kwargs.items()}


def stage_of(pp_rank: int, pp_size: int) -> str:
    """The stage name of pipeline rank ``pp_rank`` of ``pp_size``."""
    pp_rank, pp_size = as_count(pp_rank, "pp_rank"), as_count(pp_size, "pp_size", minimum=1)
    if pp_rank >= pp_size:
        raise ValueError(f"pipeline rank {pp_rank} is not in a pipeline of {pp_size} stages")
    if pp_size == 1:
        return ONLY
    return FIRST if pp_rank == 0 else LAST if pp_rank == pp_size - 1 else MIDDLE
