"""Uncollate splits three-row (M-RoPE) position ids per sample, in either layout."""

from __future__ import annotations

import pytest
import torch

from mimo_pipes.nodes.uncollate import Uncollate
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import SAMPLE_ID, STEP

IMAGE = 9


def sample(sample_id: int, length: int) -> dict:
    ids = torch.arange(10, 10 + length)
    base = torch.arange(length)
    return {
        SAMPLE_ID: sample_id, STEP: 0, "input_ids": ids, "attention_mask": torch.ones(length, dtype=torch.int64),
        "labels": ids, "loss_mask": torch.ones(length), "position_ids": torch.stack([base, base + sample_id, base * 2]),
    }


@pytest.mark.parametrize("mrope_first", [False, True])
def test_each_sample_gets_its_three_rows_back(mrope_first):
    rows = [sample(0, 5), sample(1, 9), sample(2, 3)]
    batch = collate_microbatch(rows, pad_length=12)
    assert batch["position_ids"].shape == (3, 3, 12)
    if mrope_first:
        batch["position_ids"] = batch["position_ids"].transpose(0, 1).contiguous()
    out = list(Uncollate(iter([batch]), image_token_id=IMAGE, mrope_first=mrope_first))
    for got, original in zip(out, rows):
        assert torch.equal(got["position_ids"], original["position_ids"])


def test_a_first_dimension_other_than_three_is_refused():
    batch = collate_microbatch([sample(0, 4), sample(1, 4)], pad_length=6)
    with pytest.raises(ValueError, match=r"'position_ids' must be \[3, rows, length\]"):
        list(Uncollate(iter([batch]), image_token_id=IMAGE, mrope_first=True))  # [2, 3, 6]: rows first


def test_the_setting_is_part_of_the_state_validity_only_when_on():
    plain = Uncollate(iter([]), image_token_id=IMAGE)
    assert "position ids" not in str(plain.valid_for)
    assert "position ids" in str(Uncollate(iter([]), image_token_id=IMAGE, mrope_first=True).valid_for)
