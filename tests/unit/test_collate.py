"""Collation pads and concatenates, and never shares memory with the samples (the exchange reuses its
receive buffer once a window is collated)."""

from __future__ import annotations

import torch

from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Window
from mimo_pipes.testing import SyntheticProcessedDataset


def _storages(value) -> set[int]:
    if isinstance(value, torch.Tensor):
        return {value.untyped_storage().data_ptr()}
    if isinstance(value, list):
        return set().union(*(_storages(v) for v in value)) if value else set()
    return set()


def test_collated_window_shares_no_memory_with_its_samples():
    dataset = SyntheticProcessedDataset(16, seed=1)
    samples = []
    for index in range(4):
        sample = dataset[index]
        sample.update(sample_id=index, step=7, slot=index // 2, image_tokens=0, real_tokens=0, cost=0)
        sample["boxes"] = torch.arange(index + 1)  # ragged extra field: kept as a list
        samples.append(sample)
    window = Collator(pad_length=None, pad_values={"input_ids": 0}).window(Window(7, [samples[:2], samples[2:]]))
    assert window.collated and [b["step"] for b in window.microbatches] == [7, 8]
    source = set().union(*(_storages(v) for s in samples for v in s.values()))
    for batch in window.microbatches:
        for name, value in batch.items():
            assert not (_storages(value) & source), f"{name} aliases a sample's memory"
    first = window.microbatches[0]
    assert first["input_ids"].shape[0] == 2 and first["sample_ids"] == [0, 1]
    assert torch.equal(first["boxes"][1], torch.arange(2))
    assert first["pixel_values"].shape[0] == samples[0]["pixel_values"].shape[0] + samples[1]["pixel_values"].shape[0]
