"""Read-ahead on every entry point, on every rank: take N micro-batches with the loader reading ahead, save, restore
into a fresh loader (through JSON, or a Megatron iteration folder): the next is micro-batch N; and the stream is the
same with read-ahead on and off. No read-ahead thread is left once the loaders are closed."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from scenarios_exchange import PAD_VALUES, join_layout, make_config
from scenarios_plugin import DATASET_SIZE, SEQ_LENGTH, RankMicrobatches
from scenarios_resume import fingerprint, mark_processed

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.nodes import CanonicalShardReader
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

ENTRY_POINTS = ("GraphLoader", "StatefulDataLoader", "balanced_loader", "balance_iterator", "megatron checkpoint")
THREAD = "mimo-pipes-read-ahead"


class _Adapter:
    """The rank's loader served by torchdata's StatefulDataLoader through the library's view."""

    def __init__(self, build) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        from mimo_pipes.adapters.dataloader import RankMicroBatches

        self.view = RankMicroBatches(build)
        self.loader = StatefulDataLoader(self.view, batch_size=None, num_workers=0)
        self.iterator = None

    def __next__(self) -> dict:
        if self.iterator is None:
            self.iterator = iter(self.loader)
        return next(self.iterator)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self.view.close()


def _builder(entry, config, layout, seed):
    """``make(read_ahead)``: a fresh loader of ``entry`` on this rank."""
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)

    def graph(read_ahead):
        return pipeline(dataset, dataclasses.replace(config, read_ahead=read_ahead), layout, map_fn=mark_processed,
                        image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)

    def make(read_ahead):
        if entry in ("GraphLoader", "megatron checkpoint"):
            return graph(read_ahead)
        if entry == "StatefulDataLoader":
            return _Adapter(lambda: graph(read_ahead))
        common = dict(layout=layout, micro_batch_size=config.micro_batch_size, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES,
                      read_ahead=read_ahead)
        if entry == "balanced_loader":
            reader = CanonicalShardReader(dataset, micro_batch_size=config.micro_batch_size, dp_rank=layout.dp_rank, dp_size=layout.dp_size,
                                          grid_size=layout.grid_size, seed=seed, dataloader_type=config.dataloader_type)
            return balanced_loader(reader, reorder=config.reorder, seq_length=config.seq_length, **common)
        source = RankMicrobatches(dataset, layout, micro_batch_size=config.micro_batch_size, seed=seed, with_ids=False)
        return balance_iterator(source_factory=source.iterate, config=config.reorder, seq_length=SEQ_LENGTH, **common)

    return make


def _take(loader, count):
    return [fingerprint(next(loader)) for _ in range(count)]


def read_ahead_resume(components, *, entry, point, steps, micro_batch_size, window_size=1, across=False, seed=0, read_ahead=3,
                      directory=None, settle_s=0.5):
    from mimo_pipes.exchange.world import job_group
    from mimo_pipes.megatron import checkpoint as megatron_checkpoint

    joined = join_layout(components, timeout_s=60)
    group = job_group(build_topology(components).world_size) if entry == "megatron checkpoint" else None  # the world's ranks, spare ones too
    if joined is None:
        return None
    _, groups, layout = joined
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, across=across, seed=seed,
                         seq_length=SEQ_LENGTH, global_batch_size=micro_batch_size * window_size)
    make = _builder(entry, config, layout, seed)
    off = make(0)
    reference = _take(off, steps)
    off.close()
    on = make(read_ahead)
    same = _take(on, steps) == reference
    on.close()

    first = make(read_ahead)
    head = _take(first, point)
    time.sleep(settle_s)  # the read-ahead thread fills up: micro-batches made ahead when the state is taken
    if entry == "megatron checkpoint":
        megatron_checkpoint.save_pipeline_state(directory, 1, first.state_dict(), config=config, consumed_microbatches=point, group=group)
        state = megatron_checkpoint.load_pipeline_state(directory, 1, config=config, consumed_microbatches=point)
    else:
        state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = make(read_ahead)
    second.load_state_dict(state)
    rest = _take(second, steps - point)
    second.close()
    return {"module": groups.position.module.name, "dp_rank": groups.position.dp_rank, "same_stream": same,
            "resumed": head + rest == reference,
            "next_step": rest[0][0] if rest else None, "expected_step": reference[point][0] if point < steps else None,
            "threads_left": sum(thread.name == THREAD and thread.is_alive() for thread in threading.enumerate())}
