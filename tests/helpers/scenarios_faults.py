"""Fault scenarios: one rank fails; every rank of the module must raise, within the timeout, naming it."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist
from scenarios_exchange import PAD_VALUES, join_layout, make_config

from mimo_pipes.samples.collate import SEQUENCE_FIELDS
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

COMPONENTS = ["language=dp=2", "images=dp=2,rank_offset=2"]
SEQ_LENGTH = 4096
TOO_LONG = SEQ_LENGTH + 1


class FaultyDataset(SyntheticProcessedDataset):
    """Sample ``bad_index`` is broken: it raises (source error) or carries an unpackable field."""

    def __init__(self, size, *, seed, bad_index, mode):
        super().__init__(size, seed=seed)
        self.bad_index, self.mode = bad_index, mode

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        if index == self.bad_index:
            if self.mode == "source":
                raise OSError(f"storage read failed for index {index}")
            if self.mode == "too_long":  # longer than the pad length: collation would fail after the exchange
                length = sample["input_ids"].shape[-1]
                for name in SEQUENCE_FIELDS:  # every per-token field as long, as a real over-long sample has them
                    value = sample.get(name)
                    if isinstance(value, torch.Tensor) and value.shape[-1] == length:
                        sample[name] = torch.full((*value.shape[:-1], TOO_LONG), 7 if name == "input_ids" else 1, dtype=value.dtype)
                return sample
            sample["extra"] = {"boxes": [object()]}  # not packable
        return sample


class FailingProcessor:
    """A processing step (run on torchdata's mapper threads) that fails on one sample."""

    def __init__(self, bad_index: int) -> None:
        self.bad_index = bad_index

    def __call__(self, sample: dict) -> dict:
        if sample["sample_id"] == self.bad_index:
            raise ValueError(f"cannot decode the image of sample {self.bad_index}")
        return sample


def run_fault(mode: str, *, bad_rank: int, overlap: bool, timeout_s: float = 20.0):
    """Returns (exception type name, message, seconds) per rank, or 'ok'."""
    joined = join_layout(COMPONENTS, timeout_s=timeout_s)
    if joined is None:
        return None
    topology, groups, layout = joined
    position = groups.position
    config = make_config(COMPONENTS, micro_batch_size=8, overlap=overlap, seed=1, seq_length=SEQ_LENGTH)
    # Index read by language dp rank (bad_rank % 2)'s shard at step 3: both modules read it on the matching rank.
    from mimo_pipes.parallel.sharding import global_microbatch_indices

    bad_index = int(global_microbatch_indices(3, 4096, 8, 1, True)[(bad_rank % 2) * 4 + 1])
    faulty = dist.get_rank() == bad_rank or mode == "packing"
    dataset = FaultyDataset(4096, seed=1, bad_index=bad_index if faulty and mode not in ("worker", "collate") else -1, mode=mode)
    map_fn = FailingProcessor(bad_index if faulty else -1) if mode == "worker" else None
    # "collate": this rank's pad value cannot fill a tensor, so its collation fails after every exchange.
    pad_values = {**PAD_VALUES, "labels": "pad"} if mode == "collate" and faulty else PAD_VALUES
    loader = pipeline(dataset, config, layout, map_fn=map_fn, image_token_id=IMAGE_TOKEN_ID, pad_values=pad_values)
    started = time.monotonic()
    if mode == "exit" and dist.get_rank() == bad_rank:
        next(iter(loader))
        os._exit(3)
    try:
        for _ in range(20):
            next(loader)
        outcome = ("ok", "", time.monotonic() - started)
    except Exception as error:  # noqa: BLE001 - the outcome is the result
        outcome = (type(error).__name__, str(error), time.monotonic() - started)
    finally:
        loader.close()
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    return {"module": position.module.name, "dp_rank": position.dp_rank, "outcome": outcome, "threads": threads}
