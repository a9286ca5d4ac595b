"""Builds one module rank's node chain: reader -> processing -> costs -> windows -> exchange -> micro-batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
from torchdata.nodes import BaseNode, ParallelMapper

from mimo_pipes.collate import Collator
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.exchange import ExchangeContext
from mimo_pipes.loader import GraphLoader
from mimo_pipes.nodes.balance_exchange import BalanceExchange
from mimo_pipes.nodes.canonical_shard_reader import CanonicalShardReader, MapStyleDataset
from mimo_pipes.nodes.cost_annotator import CostAnnotator
from mimo_pipes.nodes.microbatch_assembler import MicroBatchAssembler
from mimo_pipes.nodes.snapshot_guard import SnapshotGuard
from mimo_pipes.nodes.windower import Windower
from mimo_pipes.sample import Sample


@dataclass(frozen=True)
class RankLayout:
    """The part of the topology one rank's graph needs."""

    dp_rank: int
    dp_size: int
    canonical_slots: int
    exchange_group: dist.ProcessGroup | None = None
    exchange_device: torch.device | None = None  # cuda when the exchange group is NCCL


def window_start(step: int, window_size: int) -> int:
    """First step of the window holding ``step``: windows start at multiples of W."""
    return step - step % window_size


def build_graph(
    dataset: MapStyleDataset,
    config: PipelineConfig,
    layout: RankLayout,
    *,
    map_fn: Callable[[Sample], Sample] | None,
    image_token_id: int,
    pad_values: Mapping[str, int | float],
    consumed_microbatches: int = 0,
) -> GraphLoader:
    """One rank's graph. ``consumed_microbatches`` resumes from a Megatron-style count alone (the same
    stream as restoring the full state): the reader restarts at the window boundary and the assembler
    skips the micro-batches of that window already consumed."""
    window_size = reorder_window_size(config.reorder)
    first_step = window_start(consumed_microbatches, window_size)
    node: BaseNode[Any] = CanonicalShardReader(
        dataset,
        microbatch_size=config.micro_batch_size,
        dp_rank=layout.dp_rank,
        dp_size=layout.dp_size,
        canonical_slots=layout.canonical_slots,
        seed=config.seed,
        dataloader_type=config.dataloader_type,
        start_step=first_step,
    )
    if map_fn is not None:
        # The mapper stores its source's state as snapshots without copying: hand it copies.
        node = ParallelMapper(
            SnapshotGuard(node), map_fn, num_workers=max(config.num_workers, 1), in_order=True, method="thread", max_concurrent=None
        )
    node = balance_tail(
        node,
        config.reorder,
        layout,
        samples_per_rank=config.micro_batch_size // layout.dp_size,
        image_token_id=image_token_id,
        pad_values=pad_values,
        pad_length=config.seq_length if config.pad_to_seq_length else None,
        skip_first=consumed_microbatches - first_step,
    )
    return GraphLoader(node, start_count=consumed_microbatches)


def reorder_window_size(reorder: ReorderConfig) -> int:
    """Micro-batches balanced together: ``--reorder-window-size`` when reordering, else 1."""
    return reorder.reorder_window_size if reorder.intra_microbatch_reorder else 1


def balance_tail(
    node: BaseNode[Sample],
    reorder: ReorderConfig,
    layout: RankLayout,
    *,
    samples_per_rank: int,
    image_token_id: int,
    pad_values: Mapping[str, int | float],
    pad_length: int | None,
    skip_first: int = 0,
) -> MicroBatchAssembler:
    """The library's part of a graph, over any node of this rank's processed samples:
    CostAnnotator -> Windower -> BalanceExchange (when reordering) -> MicroBatchAssembler.

    ``node`` yields ``samples_per_rank`` (B/d) samples per global micro-batch, in canonical order, each
    with ``sample_id`` and ``step``, starting at a window boundary (see :func:`window_start`);
    ``skip_first`` micro-batches of that first window are dropped (resume from a count). Wrap the
    result in a :class:`GraphLoader`.
    """
    window_size = reorder_window_size(reorder)
    encoder_weight, language_weight = reorder.integer_cost_weights()
    node = CostAnnotator(node, image_token_id=image_token_id, encoder_weight=encoder_weight, language_weight=language_weight)
    node = Windower(node, samples_per_microbatch=samples_per_rank, window_size=window_size)
    if reorder.intra_microbatch_reorder:
        context = ExchangeContext(
            group=layout.exchange_group,
            dp_rank=layout.dp_rank,
            dp_size=layout.dp_size,
            canonical_slots=layout.canonical_slots,
            samples_per_rank=samples_per_rank,
            window_size=window_size,
            across_microbatches=reorder.reorder_across_microbatches,
            device=layout.exchange_device,
        )
        # The exchange collates each window right after moving it (on its prefetch thread with overlap),
        # which keeps that work off the training thread and lets it reuse its byte buffers.
        collator = Collator(pad_length, dict(pad_values))
        node = BalanceExchange(node, context, overlap=reorder.overlap_intra_microbatch_reorder, collator=collator)
    return MicroBatchAssembler(node, pad_length=pad_length, pad_values=pad_values, skip_first=skip_first)
