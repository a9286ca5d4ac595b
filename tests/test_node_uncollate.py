"""Uncollate: restore at every position (inside a batch included) and what its state is valid for. Splitting
rules (ids, images, padding, errors) are tested in test_plugin_dist.py beside the adapters that use them."""

from __future__ import annotations

import pytest
from node_checks import assert_same, check_refused, check_save_load_everywhere, saved_after

from mimo_pipes.collate import collate_microbatch
from mimo_pipes.nodes import Uncollate
from mimo_pipes.sample import SAMPLE_ID, STEP
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset

DATASET = SyntheticProcessedDataset(12, seed=5, text_tokens=3, patch_dim=2)


def batches() -> list[dict]:
    """Three collated micro-batches of four rows, as a training loop holds them (model fields only)."""
    out = []
    for step in range(3):
        samples = [{**DATASET[step * 4 + row], STEP: step} for row in range(4)]
        batch = collate_microbatch(samples, pad_length=1600, pad_values={"labels": -100})
        out.append({name: value for name, value in batch.items() if name in samples[0] and name != STEP})
    return out


def uncollate(**overrides) -> Uncollate:
    settings = dict(image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4, dp_rank=1, dp_size=2, start_step=3)
    settings.update(overrides)
    return Uncollate(batches(), **settings)


def test_restores_at_every_position():
    samples = check_save_load_everywhere(uncollate)
    assert [s[SAMPLE_ID] for s in samples] == [step * 8 + 4 + row for step in (3, 4, 5) for row in range(4)]
    for position, sample in enumerate(samples):
        assert_same({name: sample[name] for name in DATASET[position]}, DATASET[position], f"row {position}")


MISMATCHES = [
    ("image token id", dict(image_token_id=5), IMAGE_TOKEN_ID, 5),
    ("merge size", dict(merge_size=1), 2, 1),
    ("rows per batch", dict(rows_per_batch=None), 4, None),
    ("dp rank", dict(dp_rank=0), 1, 0),
    ("dp size", dict(dp_size=4), 2, 4),
]


@pytest.mark.parametrize("setting, overrides, saved, now", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_refuses_a_state_made_for_other_settings(setting, overrides, saved, now):
    check_refused(uncollate(**overrides).reset, saved_after(uncollate(), 6), "Uncollate", setting, saved, now)
