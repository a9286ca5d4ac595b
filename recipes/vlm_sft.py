"""Recipe: a Qwen2-VL-style SFT graph for one module rank of a non-colocated MIMO run.

Every module builds the same graph from the same data; only its DP layout differs. Copy this file to
build your own: :func:`pipeline` is the whole graph, one node per line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchdata.nodes import BaseNode, ParallelMapper

from mimo_pipes.collate import Collator, FieldSpec
from mimo_pipes.config import PipelineConfig, flag, planner_settings
from mimo_pipes.cost_model import CostModelError
from mimo_pipes.data.dataset import default_dataset_path
from mimo_pipes.data.processor import check_processor_path, default_processor_path, load_processor
from mimo_pipes.data.skipping import SkipBadRows
from mimo_pipes.data.sources import check_source, open_source
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import ExchangeContext, RankLayout
from mimo_pipes.loader import GraphLoader
from mimo_pipes.nodes import (
    BalanceExchange,
    CanonicalShardReader,
    CostAnnotator,
    MicroBatchAssembler,
    SequencePacker,
    SnapshotGuard,
    Windower,
)
from mimo_pipes.nodes.canonical_shard_reader import MapStyleDataset
from mimo_pipes.resume import reorder_window_size, resume_point
from mimo_pipes.sample import Sample
from mimo_pipes.topology import build_topology


def pipeline(
    dataset: MapStyleDataset,
    config: PipelineConfig,
    layout: RankLayout,
    *,
    map_fn: Callable[[Sample], Sample] | None,
    image_token_id: int | tuple[int, ...],
    pad_values: Mapping[str, int | float],
    vision_fields: Mapping[str, FieldSpec] | None = None,
    consumed_microbatches: int = 0,
    processing: str = "thread",
) -> GraphLoader:
    """This rank's loader over ``dataset`` (rows that ``map_fn`` turns into samples of unpadded tensors).

    ``consumed_microbatches`` resumes from a Megatron-style count alone: the same stream as restoring
    the loader's full state. ``image_token_id``: the placeholder ids the cost counts (image and video);
    ``vision_fields``: the vision fields every micro-batch carries, empty when no sample has them.
    ``processing``: ``thread`` or ``process`` (``map_fn`` on worker processes; it must pickle)."""
    reorder = config.reorder
    window_size = reorder_window_size(reorder)
    resume = resume_point(consumed_microbatches, window_size)
    samples_per_rank = config.micro_batch_size // layout.dp_size
    encoder_weight, language_weight = reorder.integer_cost_weights()
    cost_model = reorder.load_cost_model()
    collator = Collator(config.seq_length if config.pad_to_seq_length else None, dict(pad_values), dict(vision_fields or {}))

    # This rank's B/d samples of every global micro-batch, from the window that holds the next one.
    node: BaseNode[Any] = CanonicalShardReader(
        dataset,
        microbatch_size=config.micro_batch_size,
        dp_rank=layout.dp_rank,
        dp_size=layout.dp_size,
        grid_size=layout.grid_size,
        seed=config.seed,
        dataloader_type=config.dataloader_type,
        start_step=resume.first_step,
    )
    if map_fn is not None:
        # ParallelMapper keeps its source's state as snapshots without copying: SnapshotGuard hands it copies.
        node = ParallelMapper(
            SnapshotGuard(node), map_fn, num_workers=max(config.num_workers, 1), in_order=True, method=processing,
            multiprocessing_context="spawn" if processing == "process" else None,
        )
    node = CostAnnotator(
        node, image_token_id=image_token_id, encoder_weight=encoder_weight, language_weight=language_weight,
        language_square_weight=reorder.integer_language_square_weight(), cost_model=cost_model,
    )
    node = Windower(node, samples_per_microbatch=samples_per_rank, window_size=window_size)
    if reorder.intra_microbatch_reorder:
        # Floor and two-level grouping come from the component specs, so every module plans alike.
        settings = planner_settings(build_topology(config.components), reorder, cost_model)
        exchange = ExchangeContext.for_layout(
            layout, samples_per_rank=samples_per_rank, window_size=window_size, across_microbatches=reorder.reorder_across_microbatches,
            floor=settings.floor, encoder_groups=settings.encoder_groups,
        )
        # Collates each window right after moving it (on the prefetch thread with overlap).
        node = BalanceExchange(node, exchange, overlap=reorder.overlap_intra_microbatch_reorder, collator=collator)
    node = MicroBatchAssembler(node, collator=collator, skip_first=resume.skip_first)
    if config.pack_sequences_in_batch:
        # One THD row per micro-batch, after the exchange: packing never changes which samples a rank holds.
        node = SequencePacker(node, pad_multiple=config.pack_pad_multiple, pad_values=collator.pad_values)
    return GraphLoader(node, start_count=resume.consumed)


def dataset_path(config: PipelineConfig) -> str:
    return config.dataset or str(default_dataset_path(config.embedded_samples, seed=0))


def processor_path(config: PipelineConfig) -> str:
    return config.processor or str(default_processor_path())


def prepare(config: PipelineConfig, log: Callable[[str], None] = print) -> None:
    """Check user paths, and build the embedded data and processor once before the ranks start."""
    if config.dataset is not None:
        check_source(config.dataset)
    else:
        log(f"embedded dataset: {config.embedded_samples} synthetic VLM samples")
    if config.processor is not None:
        check_processor_path(config.processor)
    check_cost_model(config, load_processor(processor_path(config), config.seq_length))
    log(f"processor: {processor_path(config)}")
    dataset = open_source(dataset_path(config))
    if len(dataset) < config.micro_batch_size:
        raise ConfigError("--dataset", f"{len(dataset)} samples are fewer than one micro-batch of {config.micro_batch_size}")


def check_cost_model(config: PipelineConfig, processor: Any) -> None:
    """A time model fit for other patches than the processor makes is refused."""
    model = config.reorder.load_cost_model()
    if model is None:
        return
    try:
        model.check_geometry(
            config.reorder.reorder_cost_model,
            merge_size=processor.merge_size,
            patch_size=processor.patch_size,
            temporal_patch_size=processor.temporal_patch_size,
        )
    except CostModelError as error:
        raise ConfigError(flag("reorder_cost_model"), str(error)) from None


def build(
    config: PipelineConfig, layout: RankLayout, *, consumed_microbatches: int = 0, processing: str = "thread"
) -> GraphLoader:
    """This rank's loader; ``consumed_microbatches`` resumes from a Megatron-style count; ``processing``:
    per-sample processing on ``thread``s or worker ``process``es."""
    processor = load_processor(processor_path(config), config.seq_length, image_folder=config.image_folder)
    check_cost_model(config, processor)
    dataset = open_source(dataset_path(config))
    map_fn: Callable[[Sample], Sample] = processor
    if config.skip_bad_samples:
        map_fn = SkipBadRows(
            processor, dataset, microbatch_size=config.micro_batch_size, grid_size=layout.grid_size,
            seed=config.seed, dataloader_type=config.dataloader_type,
        )
    return pipeline(
        dataset,
        config,
        layout,
        map_fn=map_fn,
        image_token_id=processor.placeholder_ids,
        pad_values={"input_ids": processor.pad_token_id, "labels": -100},
        vision_fields=processor.vision_fields,
        consumed_microbatches=consumed_microbatches,
        processing=processing,
    )
