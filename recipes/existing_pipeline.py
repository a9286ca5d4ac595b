"""Example: a torchdata.nodes pipeline as a user might already have one, ready for the balance exchange.

:func:`example_samples` is one way to write the reader: a torch Sampler over this rank's positions of every
global micro-batch, SamplerWrapper, Mapper (and a ParallelMapper). Hand the node it returns to
:func:`mimo_pipes.adapters.torchdata_pipeline.balanced_loader`, which appends the library's tail; start the
reader at :func:`~mimo_pipes.adapters.torchdata_pipeline.reader_first_step` to resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Sampler
from torchdata.nodes import BaseNode, Mapper, ParallelMapper, SamplerWrapper

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import SnapshotGuard
from mimo_pipes.parallel.sharding import shard_indices
from mimo_pipes.samples.sample import SAMPLE_ID, STEP, Sample
from mimo_pipes.settings.counts import as_count


class RankShardSampler(Sampler):
    """Example reader: ``(step, dataset index)`` for this rank's positions of every global micro-batch
    from ``first_step`` on, reshuffling each epoch from the seed. Never ends."""

    def __init__(self, dataset_size: int, *, micro_batch_size: int, layout: RankLayout, seed: int, first_step: int = 0) -> None:
        self.dataset_size = dataset_size
        self.micro_batch_size = micro_batch_size
        self.layout = layout
        self.seed = seed
        self.first_step = as_count(first_step, "first_step")

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next fresh start on, begin at ``point.first_step``: what lets the loader continue a state
        saved under another layout (see ``GraphLoader.load_state_dict``)."""
        self.first_step = point.first_step

    def __iter__(self) -> Iterator[tuple[int, int]]:
        rank, step = self.layout, self.first_step
        while True:
            for index in shard_indices(step, rank.dp_rank, rank.dp_size, self.dataset_size, self.micro_batch_size, self.seed, True):
                yield step, int(index)
            step += 1


class _LoadRow:
    """Reads one dataset row and tags it with its id and step."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, step_and_index: tuple[int, int]) -> Sample:
        step, index = step_and_index
        row = dict(self.dataset[index])
        row[SAMPLE_ID], row[STEP] = index, step
        return row


def example_samples(
    dataset: Any,
    *,
    micro_batch_size: int,
    layout: RankLayout,
    seed: int,
    first_step: int = 0,
    map_fn: Callable[[Sample], Sample] | None = None,
    num_workers: int = 2,
) -> BaseNode[Sample]:
    """A pipeline as a user might already have one: sampler -> SamplerWrapper -> Mapper -> ParallelMapper."""
    sampler = RankShardSampler(len(dataset), micro_batch_size=micro_batch_size, layout=layout, seed=seed, first_step=first_step)
    node: BaseNode[Sample] = Mapper(SamplerWrapper(sampler), _LoadRow(dataset))
    if map_fn is not None:
        # ParallelMapper keeps its source's state without copying it: SnapshotGuard hands it copies.
        node = ParallelMapper(SnapshotGuard(node), map_fn, num_workers=num_workers, in_order=True, method="thread")
    return node
