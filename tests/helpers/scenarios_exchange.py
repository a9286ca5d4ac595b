"""Scenarios run on every rank of a Gloo pool: build a module rank's graph on synthetic processed samples."""

from __future__ import annotations

import torch

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.exchange.process_groups import build_rank_groups
from mimo_pipes.graph.traversal import graph_nodes
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset, check_sample
from mimo_pipes_recipes.vlm_sft import pipeline

PAD_VALUES = {"input_ids": 0, "labels": -100}


def join_layout(components, *, exchange_backend="gloo", timeout_s=60.0):
    """(topology, rank groups, exchange layout) of this rank, or None for a rank beyond the topology."""
    topology = build_topology(components)
    groups = build_rank_groups(topology, exchange_backend=exchange_backend, timeout_s=timeout_s)
    if groups is None:
        return None
    position = groups.position
    device = torch.device("cuda", torch.cuda.current_device()) if exchange_backend == "nccl" else None
    return topology, groups, RankLayout(position.dp_rank, position.dp_size, topology.grid_size, groups.exchange_group, device)


def make_config(components, *, micro_batch_size, reorder=True, window_size=1, across=False, overlap=True,
                dataloader_type="cyclic", global_batch_size=None, seed=0, seq_length=4096,
                pack_sequences_in_batch=False, pack_pad_multiple=1, reorder_language_cost="tokens",
                reorder_language_cost_weight=0.0) -> PipelineConfig:
    return PipelineConfig(
        components=tuple(components),
        micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size,
        seq_length=seq_length,
        dataloader_type=dataloader_type,
        seed=seed,
        num_workers=1,
        pack_sequences_in_batch=pack_sequences_in_batch,
        pack_pad_multiple=pack_pad_multiple,
        reorder=ReorderConfig(
            scalable_dp=True,
            intra_microbatch_reorder=reorder,
            overlap_intra_microbatch_reorder=overlap,
            reorder_window_size=window_size,
            reorder_across_microbatches=across,
            reorder_language_cost=reorder_language_cost,
            reorder_language_cost_weight=reorder_language_cost_weight,
        ),
    )


def rank_result(position, records: list[dict], **extra) -> dict:
    """What a scenario returns for one rank: where it sits and the micro-batches it consumed."""
    return {
        "module": position.module.name,
        "dp_rank": position.dp_rank,
        "dp_size": position.dp_size,
        "tp_rank": position.tp_rank,
        "pp_rank": position.pp_rank,
        "records": records,
        **extra,
    }


def check_batch(batch: dict, dataset: SyntheticProcessedDataset) -> None:
    """Every sample of a collated micro-batch is intact: token rows and its pixel rows."""
    offset = 0
    for row, sample_id in enumerate(batch["sample_ids"]):
        expected = dataset[sample_id]
        length = len(expected["input_ids"])
        patches = expected["pixel_values"].shape[0]
        received = {
            name: batch[name][row, :length] for name in ("input_ids", "attention_mask", "labels", "loss_mask", "position_ids")
        }
        received["pixel_values"] = batch["pixel_values"][offset : offset + patches]
        received["image_grid_thw"] = expected["image_grid_thw"]
        check_sample(received, dataset, sample_id)
        assert int(batch["attention_mask"][row].sum()) == length, f"sample {sample_id}: padding is not masked"
        offset += patches
    assert offset == batch["pixel_values"].shape[0], "pixel_values has rows of no sample"


class RecordingDataset(SyntheticProcessedDataset):
    """Remembers which indices were read, to show that scalable DP reads only the rank's shard."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: list[int] = []

    def __getitem__(self, index):
        self.reads.append(index)
        return super().__getitem__(index)


def run_graph(components, *, steps, dataset_size=4096, timeout_s=60.0, exchange_backend="gloo", **config_kwargs):
    joined = join_layout(components, exchange_backend=exchange_backend, timeout_s=timeout_s)
    if joined is None:
        return None
    topology, groups, layout = joined
    config = make_config(components, **config_kwargs)
    config.validate(world_size=topology.world_size)
    dataset = RecordingDataset(dataset_size, seed=config.seed)
    reference = SyntheticProcessedDataset(dataset_size, seed=config.seed)
    position = groups.position
    loader = pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
    loader.end_at(steps)  # nothing read beyond the run's last window (the read-ahead would otherwise read on)
    records = []
    try:
        for batch in loader:
            check_batch(batch, reference)
            records.append({"step": batch["step"], "sample_ids": batch["sample_ids"], "image_tokens": batch["image_tokens"]})
            if len(records) == steps:
                break
    finally:
        loader.close()
    reads = sorted(set(dataset.reads))
    return rank_result(position, records, reads=reads)


def exchange_threads(ignore: frozenset = frozenset()) -> list[str]:
    """The names of the library's live threads, leaving out the thread objects in ``ignore``."""
    import threading

    return sorted(t.name for t in threading.enumerate() if t.name.startswith("mimo-pipes") and t not in ignore)


def run_thread_lifecycle(components, *, micro_batch_size=8, window_size=2):
    """Prefetch depth under a slow consumer, and no exchange thread left after finish, reset or delete."""
    import gc
    import threading
    import time

    from mimo_pipes.nodes.balance_exchange import BalanceExchange
    from mimo_pipes.nodes.exchange_prefetch import PREFETCH_DEPTH

    # Threads a test before this one left in this pool process are not this scenario's: it counts the threads it
    # adds, by identity (a leftover of the same name may end meanwhile, which counting names would take for one
    # of this scenario's threads missing).
    before = frozenset(threading.enumerate())

    def added() -> list[str]:
        return exchange_threads(ignore=before)

    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined

    def new_loader(dataset_size, dataloader_type="cyclic"):
        config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size,
                             dataloader_type=dataloader_type)
        dataset = SyntheticProcessedDataset(dataset_size, seed=0)
        return pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)

    def exchange_node(loader):
        return next(node for node in graph_nodes(loader.root) if isinstance(node, BalanceExchange))

    report = {}
    # 1. A slow consumer: the thread never holds more than PREFETCH_DEPTH exchanged windows.
    loader = new_loader(4096)
    iterator = iter(loader)
    held = []
    for _ in range(12):
        next(iterator)
        time.sleep(0.05)
        held.append(exchange_node(loader).prefetched().queued)
    report["max_held"] = max(held)
    report["depth"] = PREFETCH_DEPTH
    # 2. A reset (a restore: a later iter() alone continues) replaces the thread rather than adding one.
    loader.load_state_dict(loader.state_dict())
    iterator = iter(loader)
    next(iterator)
    report["threads_after_reset"] = added()
    # 3. Deleting the loader stops the thread (peers delete at the same point).
    del iterator, loader
    gc.collect()
    deadline = time.monotonic() + 20
    while added() and time.monotonic() < deadline:
        time.sleep(0.05)
    report["threads_after_delete"] = added()
    # 4. A finished stream (single sampler) leaves no thread behind.
    loader = new_loader(80, dataloader_type="single")
    report["consumed_to_end"] = sum(1 for _ in loader)
    report["threads_after_end"] = added()
    loader.close()
    return report
