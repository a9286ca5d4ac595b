"""Resuming inside Megatron: its checkpoints keep ``consumed_train_samples``, the pipeline counts micro-batches.

Every function here takes the values Megatron keeps, by Megatron's names, as keywords:
``consumed_train_samples``, ``global_batch_size``, ``micro_batch_size`` (per data-parallel rank, Megatron-LM's
``--micro-batch-size``) and ``data_parallel_size``. Megatron-LM's ``args`` holds all four; Megatron-Bridge keeps
``train_state.consumed_train_samples`` and ``cfg.train.global_batch_size``, ``cfg.train.micro_batch_size``,
``cfg.data_parallel_size`` (its MIMO loop sets the data-parallel size to 1: its micro-batch is global).

One micro-step of Megatron consumes ``micro_batch_size * data_parallel_size`` samples: the pipeline's global
micro-batch ``B`` (its ``--micro-batch-size``, which is global). After every iteration Megatron adds its global
batch to ``consumed_train_samples``, a whole number of micro-steps, so the pipeline has consumed
``consumed_train_samples / B`` micro-batches, and a graph built with that count
(``build(config, layout, consumed_microbatches=...)``) continues the stream exactly where the checkpoint
stopped (see :mod:`mimo_pipes.checkpoint.resume`). Taking the per-rank size and the data-parallel size apart
leaves no room for the per-rank / global mix-up (a per-rank size passed as ``B`` would resume ``dp`` times too
far ahead). Inconsistent values are refused in one line naming the argument.
"""

from __future__ import annotations

from mimo_pipes.config.counts import as_count
from mimo_pipes.errors import ConfigError


def global_microbatch_size(*, micro_batch_size: int, data_parallel_size: int) -> int:
    """The samples one micro-step of Megatron consumes: the pipeline's ``micro_batch_size`` (``PipelineConfig``,
    ``--micro-batch-size``), from Megatron's per-rank micro-batch size and data-parallel size."""
    return as_count(micro_batch_size, "micro_batch_size", minimum=1) * as_count(data_parallel_size, "data_parallel_size", minimum=1)


def _step_size(global_batch_size: object, micro_batch_size: object, data_parallel_size: object) -> int:
    """``global_microbatch_size``, after checking that Megatron's global batch is a whole number of micro-steps."""
    step = global_microbatch_size(micro_batch_size=micro_batch_size, data_parallel_size=data_parallel_size)
    batch = as_count(global_batch_size, "global_batch_size", minimum=1)
    if batch % step:
        raise ConfigError("global_batch_size", f"{batch} is not divisible by micro_batch_size x data_parallel_size = {step} "
                                               "(the samples of one micro-step): Megatron refuses such a batch too")
    return step


def microbatches_from_samples(
    *, consumed_train_samples: int, global_batch_size: int, micro_batch_size: int, data_parallel_size: int
) -> int:
    """The pipeline's consumed micro-batches for a Megatron checkpoint's ``consumed_train_samples``. Refused
    (ConfigError naming the argument) unless every value is an integer, the global batch a whole number of
    micro-steps, and the samples a whole number of micro-steps (else the checkpoint is of another batch size)."""
    step = _step_size(global_batch_size, micro_batch_size, data_parallel_size)
    samples = as_count(consumed_train_samples, "consumed_train_samples")
    if samples % step:
        raise ConfigError(
            "consumed_train_samples",
            f"{samples} is not a multiple of micro_batch_size x data_parallel_size = {step} (the samples of one "
            f"micro-step): {samples // step} micro-steps and {samples % step} samples; resume with the batch sizes the "
            "checkpoint was trained with",
        )
    return samples // step


def samples_from_microbatches(
    *, consumed_microbatches: int, global_batch_size: int, micro_batch_size: int, data_parallel_size: int
) -> int:
    """Megatron's ``consumed_train_samples`` after the pipeline handed out ``consumed_microbatches``."""
    step = _step_size(global_batch_size, micro_batch_size, data_parallel_size)
    return as_count(consumed_microbatches, "consumed_microbatches") * step
