"""Uncollate: restore at every position (inside a batch included) and what its state is valid for. Splitting
rules (ids, images, padding, errors) are tested in test_plugin_dist.py beside the adapters that use them."""

from __future__ import annotations

import pytest
import torch
from node_checks import assert_same, check_refused, check_save_load_everywhere, saved_after, starting_at

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.config import ReorderConfig
from mimo_pipes.errors import SampleError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import Uncollate
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import SAMPLE_ID, STEP
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
    first_step = overrides.pop("first_step", 3)
    settings = dict(image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4, dp_rank=1, dp_size=2)
    settings.update(overrides)
    return starting_at(Uncollate(batches(), **settings), first_step)


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


def test_read_steps_are_carried_by_collation_and_not_taken_back():
    """A micro-batch of samples read for several steps (moved across a window): collation keeps each one's
    read step in ``read_steps``; Uncollate reads the rows anew at the step it counts, so the Windower after
    it sees whole micro-batches of one step."""
    samples = [{**DATASET[row], STEP: 4 + row % 2, "slot": row // 2} for row in range(4)]
    batch = collate_microbatch(samples, step=6, pad_length=1600, pad_values={"labels": -100})
    assert batch["step"] == 6 and batch["read_steps"] == [4, 5, 4, 5] and batch["slots"] == [0, 0, 1, 1]
    rows = list(starting_at(Uncollate([batch], image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4), 9))
    assert [row[STEP] for row in rows] == [9] * 4
    assert [row["slot"] for row in rows] == [0, 0, 1, 1] and all("read_steps" not in row for row in rows)


PER_TOKEN_FIELDS = ("labels", "attention_mask", "loss_mask", "position_ids")


def _with_field_cut(field: str) -> list[dict]:
    """The batches with ``field`` one token shorter than ``input_ids`` in the second micro-batch."""
    out = batches()
    if field == "loss_mask":
        out[1][field] = (out[1]["labels"] != -100).float()
    if field == "position_ids":
        out[1][field] = torch.arange(out[1]["input_ids"].shape[1]).repeat(4, 1)
    out[1][field] = out[1][field][:, :-1]
    return out


@pytest.mark.parametrize("field", PER_TOKEN_FIELDS)
def test_a_per_token_field_of_another_length_than_input_ids_is_refused(field):
    node = Uncollate(_with_field_cut(field), image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4, dp_rank=0, dp_size=1)
    node.reset()
    assert [next(node)[SAMPLE_ID] for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(SampleError, match=f"micro-batch 1, row 0: {field} has 1599 tokens but input_ids has 1600") as info:
        next(node)
    assert info.value.field == field and info.value.sample_id == 4


def test_balance_iterator_refuses_labels_one_token_short():
    source = _with_field_cut("labels")
    wrapped = balance_iterator(source, config=ReorderConfig(), layout=RankLayout(dp_rank=0, dp_size=1, grid_size=1),
                               micro_batch_size=4, image_token_id=IMAGE_TOKEN_ID, pad_values={"labels": -100}, seq_length=1600)
    with wrapped:
        next(wrapped)
        with pytest.raises(SampleError, match="labels has 1599 tokens but input_ids has 1600"):
            next(wrapped)
