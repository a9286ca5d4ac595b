"""Scenarios run on every rank of a Gloo pool: the module graph and the plain-iterator wrapper with sequence
packing (THD) after reordering."""

from __future__ import annotations

import torch
from scenarios_exchange import PAD_VALUES, join_layout, make_config, rank_result
from scenarios_plugin import DATASET_SIZE, SEQ_LENGTH, _rank, assert_batches_equal, graph_batches_and_wrapper

from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.samples.thd import CU_SEQLENS, CU_SEQLENS_UNPADDED, MAX_SEQLEN
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset, check_sample
from mimo_pipes_recipes.vlm_sft import pipeline

TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids")


def check_packed_batch(batch: dict, dataset: SyntheticProcessedDataset, pad_multiple: int) -> None:
    """Every sample of a packed micro-batch is intact: its tokens cut from the packed row by cu_seqlens,
    padding never trained on, its pixel rows in sample order."""
    assert "attention_mask" not in batch, "a packed micro-batch carries no attention mask"
    cu, cu_real = batch[CU_SEQLENS], batch[CU_SEQLENS_UNPADDED]
    assert cu.dtype == torch.int32 and len(cu) == len(batch["sample_ids"]) + 1
    assert batch["input_ids"].shape == (1, int(cu[-1]))
    assert batch[MAX_SEQLEN] == int((cu[1:] - cu[:-1]).max())
    offset = 0
    for row, sample_id in enumerate(batch["sample_ids"]):
        expected = dataset[sample_id]
        length, start, end = len(expected["input_ids"]), int(cu[row]), int(cu[row + 1])
        assert int(cu_real[row + 1] - cu_real[row]) == length == batch["real_tokens"][row]
        assert (end - start) % pad_multiple == 0 and end - start - length < pad_multiple
        received = {name: batch[name][0, start : start + length] for name in TOKEN_FIELDS}
        received["attention_mask"] = torch.ones(length, dtype=torch.int64)
        patches = expected["pixel_values"].shape[0]
        received["pixel_values"] = batch["pixel_values"][offset : offset + patches]
        received["image_grid_thw"] = expected["image_grid_thw"]
        check_sample(received, dataset, sample_id)
        assert torch.all(batch["labels"][0, start + length : end] == -100) and torch.all(batch["loss_mask"][0, start + length : end] == 0)
        offset += patches
    assert offset == batch["pixel_values"].shape[0], "pixel_values has rows of no sample"


def run_packed_graph(components, *, steps, pad_multiple=1, dataset_size=4096, **config_kwargs):
    """The recipe's graph with packing on: each micro-batch checked sample by sample; the packer's metrics."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    config = make_config(components, pack_sequences_in_batch=True, pack_pad_multiple=pad_multiple, **config_kwargs)
    config.validate(world_size=topology.world_size)
    dataset = SyntheticProcessedDataset(dataset_size, seed=config.seed)
    position = groups.position
    loader = pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
    loader.end_at(steps)
    records, metrics = [], []
    try:
        for batch in loader:
            check_packed_batch(batch, dataset, pad_multiple)
            records.append({"step": batch["step"], "sample_ids": batch["sample_ids"], "image_tokens": batch["image_tokens"],
                            "costs": batch["costs"], "real_tokens": batch["real_tokens"]})
            metrics.append(dict(loader.root.last_metrics))
            if len(records) == steps:
                break
    finally:
        loader.close()
    return rank_result(position, records, metrics=metrics)


def run_wrapper_packed(components, *, steps, micro_batch_size, seed, window_size=1, across=False, pad_multiple=8):
    """balance_iterator(pack_sequences=True) over a user's collated micro-batches gives, bitwise, what the
    recipe's graph with packing gives for the same samples."""
    rank = _rank(components)
    if rank is None:
        return None
    position, layout = rank
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, across=across, seed=seed,
                         seq_length=SEQ_LENGTH, global_batch_size=micro_batch_size * window_size,
                         pack_sequences_in_batch=True, pack_pad_multiple=pad_multiple)
    config.validate(world_size=build_topology(components).world_size)
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
    expected, wrapped = graph_batches_and_wrapper(dataset, config, layout, steps=steps, micro_batch_size=micro_batch_size, seed=seed,
                                                  with_ids=True, pack_sequences=True, pack_pad_multiple=pad_multiple)
    records = []
    with wrapped:
        for step, want in enumerate(expected):
            got = next(wrapped)
            assert got["sample_ids"] == want["sample_ids"], f"step {step}: the wrapper holds other samples"
            check_packed_batch(got, dataset, pad_multiple)
            assert_batches_equal(got, want, f"step {step}")
            assert got[MAX_SEQLEN] == want[MAX_SEQLEN]
            records.append({"step": got["step"], "sample_ids": got["sample_ids"], "image_tokens": got["image_tokens"]})
    return rank_result(position, records)
