"""Which dataset rows make up a global micro-batch, and which of them a DP rank reads: pure arithmetic.

Global micro-batch ``step`` of an epoch takes ``B`` consecutive entries of that epoch's order. ``single``
walks the dataset once in index order; ``cyclic`` reshuffles every epoch from ``(seed, epoch)`` with
numpy's PCG64, which yields the same permutation on every platform, and never ends.
"""

from __future__ import annotations

import functools

import numpy as np

from mimo_pipes.parallel.topology import owned_positions


def microbatches_per_epoch(dataset_size: int, micro_batch_size: int) -> int:
    """Full global micro-batches in one epoch (drop_last: a partial tail is never read)."""
    return dataset_size // micro_batch_size


@functools.lru_cache(maxsize=4)
def epoch_order(dataset_size: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The epoch's order of the dataset's rows (read-only). The last four are kept: a reader asks for one
    micro-batch after another, every micro-batch of an epoch shares its order, and a process may hold a few
    readers (an epoch's end and the next, another dataset's) without computing an order per sample."""
    if not shuffle:
        order = np.arange(dataset_size, dtype=np.int64)
    else:
        order = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(dataset_size)
    order.setflags(write=False)
    return order


def global_microbatch_indices(
    step: int, dataset_size: int, micro_batch_size: int, seed: int, shuffle: bool
) -> np.ndarray:
    """The B dataset indices of global micro-batch ``step``, in canonical order (what a non-scalable reader reads)."""
    per_epoch = microbatches_per_epoch(dataset_size, micro_batch_size)
    if per_epoch == 0:
        raise ValueError(f"dataset of {dataset_size} samples holds no full micro-batch of {micro_batch_size}")
    epoch, within = divmod(step, per_epoch)
    order = epoch_order(dataset_size, epoch, seed, shuffle)
    return order[within * micro_batch_size : (within + 1) * micro_batch_size]


def shard_indices(
    step: int, dp_rank: int, dp_size: int, dataset_size: int, micro_batch_size: int, seed: int, shuffle: bool
) -> np.ndarray:
    """This DP rank's slots of global micro-batch ``step`` (scalable DP reads only these)."""
    positions = owned_positions(dp_rank, dp_size, micro_batch_size)
    return global_microbatch_indices(step, dataset_size, micro_batch_size, seed, shuffle)[positions.start : positions.stop]
