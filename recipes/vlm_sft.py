"""Recipe: a Qwen2-VL-style SFT graph for one module rank of a non-colocated MIMO run.

source (HF dataset) -> CanonicalShardReader -> processor (threads) -> CostAnnotator -> Windower
-> BalanceExchange (when reordering) -> MicroBatchAssembler -> GraphLoader.

Every module builds the same graph from the same data; only its DP layout differs.
"""

from __future__ import annotations

from typing import Callable

from mimo_pipes.config import PipelineConfig
from mimo_pipes.data.dataset import check_dataset_path, default_dataset_path, open_dataset
from mimo_pipes.errors import ConfigError
from mimo_pipes.data.processor import check_processor_path, default_processor_path, load_processor
from mimo_pipes.graph import RankLayout, build_graph
from mimo_pipes.loader import GraphLoader


def dataset_path(config: PipelineConfig) -> str:
    return config.dataset or str(default_dataset_path(config.embedded_samples, seed=0))


def processor_path(config: PipelineConfig) -> str:
    return config.processor or str(default_processor_path())


def prepare(config: PipelineConfig, log: Callable[[str], None] = print) -> None:
    """Check user paths, and build the embedded data and processor once before the ranks start."""
    if config.dataset is not None:
        check_dataset_path(config.dataset)
    else:
        log(f"embedded dataset: {config.embedded_samples} synthetic VLM samples")
    if config.processor is not None:
        check_processor_path(config.processor)
    dataset_path(config)
    processor = load_processor(processor_path(config), config.seq_length)
    log(f"processor: {processor_path(config)}")
    dataset = open_dataset(dataset_path(config))
    if len(dataset) < config.micro_batch_size:
        raise ConfigError("--dataset", f"{len(dataset)} samples are fewer than one micro-batch of {config.micro_batch_size}")
    del processor


def build(config: PipelineConfig, layout: RankLayout, *, consumed_microbatches: int = 0) -> GraphLoader:
    """This rank's loader; ``consumed_microbatches`` resumes from a Megatron-style count."""
    dataset = open_dataset(dataset_path(config))
    processor = load_processor(processor_path(config), config.seq_length)
    return build_graph(
        dataset,
        config,
        layout,
        map_fn=processor,
        image_token_id=processor.image_token_id,
        pad_values={"input_ids": processor.pad_token_id, "labels": -100},
        consumed_microbatches=consumed_microbatches,
    )
