"""Recipe: the balance exchange inserted into a torchdata.nodes pipeline you already have.

your reader -> your mappers (Mapper / ParallelMapper) -> CostAnnotator -> Windower -> BalanceExchange
-> MicroBatchAssembler -> GraphLoader.

Your part must yield this rank's B/d samples of every global micro-batch, in canonical order (DP rank r
of d holds positions r*B/d .. (r+1)*B/d - 1), each a dict of unpadded tensors with ``sample_id`` and
``step`` (see mimo_pipes/samples/sample.py). :func:`build` appends the library's part; :func:`example_samples`
shows one way to write the reader: a torch Sampler over this rank's positions, SamplerWrapper, Mapper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import Sampler
from torchdata.nodes import BaseNode, Mapper, ParallelMapper, SamplerWrapper

from mimo_pipes.checkpoint.resume import ResumePoint, reorder_window_size, resume_point
from mimo_pipes.config import ReorderConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.graph.tail import balanced_tail
from mimo_pipes.graph.tail_settings import resolve_tail
from mimo_pipes.nodes import SnapshotGuard
from mimo_pipes.parallel.sharding import shard_indices
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.samples.sample import SAMPLE_ID, STEP, Sample


def first_step(reorder: ReorderConfig, consumed_microbatches: int = 0) -> int:
    """The global micro-batch your reader must start at to resume after ``consumed_microbatches``."""
    return resume_point(consumed_microbatches, reorder_window_size(reorder)).first_step


def build(
    samples: BaseNode[Sample],
    *,
    reorder: ReorderConfig,
    layout: RankLayout,
    micro_batch_size: int,
    seq_length: int,
    image_token_id: int | tuple[int, ...],
    pad_values: Mapping[str, int | float],
    pad_to_seq_length: bool = True,
    consumed_microbatches: int = 0,
    components: Sequence[str] | None = None,
) -> GraphLoader:
    """This rank's loader of balanced, padded micro-batches over your ``samples`` node.

    ``samples`` starts at global micro-batch ``first_step(reorder, consumed_microbatches)``; the loader
    skips what was already consumed of that window. ``micro_batch_size`` is the global B. ``components``:
    every module's spec (as ``--component`` takes them), needed with a time model or two-level balance so
    that the planner's floor and encoder replicas are the run's. Bad settings raise ConfigError naming the
    flag. The loader's ``state_dict`` holds your nodes' state too, so restoring it restores your reader.
    """
    tail = resolve_tail(
        reorder,
        micro_batch_size=micro_batch_size,
        dp_size=layout.dp_size,
        grid_size=layout.grid_size,
        image_token_ids=image_token_id,
        pad_length=seq_length if pad_to_seq_length else None,
        pad_values=pad_values,
        topology=build_topology(components) if components is not None else None,
        consumed_microbatches=consumed_microbatches,
    )
    return GraphLoader(balanced_tail(samples, settings=tail, layout=layout), consumed_microbatches=tail.resume.consumed)


class RankShardSampler(Sampler):
    """Example reader: ``(step, dataset index)`` for this rank's positions of every global micro-batch
    from ``first_step`` on, reshuffling each epoch from the seed. Never ends."""

    def __init__(self, dataset_size: int, *, micro_batch_size: int, layout: RankLayout, seed: int, first_step: int = 0) -> None:
        self.dataset_size = dataset_size
        self.micro_batch_size = micro_batch_size
        self.layout = layout
        self.seed = seed
        self.first_step = first_step

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
