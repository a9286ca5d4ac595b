"""Resuming inside Megatron: its checkpoints keep ``consumed_train_samples``, the pipeline counts micro-batches.

Megatron adds its global batch size to ``consumed_train_samples`` after every iteration, and a global batch
is ``num_microbatches`` global micro-batches of ``B`` samples (``B`` = Megatron's ``--micro-batch-size``
times the language model's data-parallel size: the pipeline's ``--micro-batch-size``). So the pipeline has
consumed ``consumed_train_samples / B`` micro-batches, and a graph built with that count
(``build(config, layout, consumed_microbatches=...)``, ``balance_iterator(consumed_microbatches=...)``)
continues the stream exactly where the checkpoint stopped (see :mod:`mimo_pipes.checkpoint.resume`).
"""

from __future__ import annotations


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _check_size(global_microbatch_size: object) -> int:
    if isinstance(global_microbatch_size, bool) or not isinstance(global_microbatch_size, int) or global_microbatch_size < 1:
        raise ValueError(f"the global micro-batch size (--micro-batch-size) must be an integer >= 1, got {global_microbatch_size!r}")
    return global_microbatch_size


def microbatches_from_samples(consumed_train_samples: int, global_microbatch_size: int) -> int:
    """The pipeline's consumed micro-batches for Megatron's ``consumed_train_samples``; ValueError unless it
    is a whole number of global micro-batches (a checkpoint of another batch size, or of another run)."""
    samples = _check_count(consumed_train_samples, "consumed_train_samples")
    size = _check_size(global_microbatch_size)
    if samples % size:
        raise ValueError(
            f"consumed_train_samples {samples} is not a multiple of the global micro-batch size {size} "
            f"(--micro-batch-size): {samples // size} micro-batches and {samples % size} samples; resume with the "
            "micro-batch size the checkpoint was trained with"
        )
    return samples // size


def samples_from_microbatches(consumed_microbatches: int, global_microbatch_size: int) -> int:
    """Megatron's ``consumed_train_samples`` after the pipeline handed out ``consumed_microbatches``."""
    return _check_count(consumed_microbatches, "consumed micro-batches") * _check_size(global_microbatch_size)
