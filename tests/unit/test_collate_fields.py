"""Collation over the union of fields: text-only samples beside image samples, in any order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.errors import SampleError
from mimo_pipes.nodes.uncollate import Uncollate
from mimo_pipes.samples.collate import VISION_ROWS, collate_microbatch

IMAGE = 9
PATCH_DIM = 6
DECLARED = {"pixel_values": ((PATCH_DIM,), torch.float32), "image_grid_thw": ((3,), torch.int64)}


def make_sample(index: int, images: list[int], mrope: bool) -> dict:
    """``images``: placeholder tokens per image (each image is 1 x 2 x (2 * tokens) patches, merge 2)."""
    tokens = [1, 2] + [IMAGE] * sum(images) + [3] * (index % 4 + 1)
    length = len(tokens)
    sample = {
        "sample_id": index, "step": 0, "slot": 0,
        "input_ids": torch.tensor(tokens),
        "attention_mask": torch.ones(length, dtype=torch.int64),
        "labels": torch.tensor(tokens),
        "position_ids": torch.arange(length).expand(3, length).clone() if mrope else torch.arange(length),
    }
    if images:  # a real processor's text-only samples carry no vision fields at all
        grid = torch.tensor([[1, 2, 2 * n] for n in images])
        sample["image_grid_thw"] = grid
        sample["pixel_values"] = torch.full((int(grid.prod(1).sum()), PATCH_DIM), float(index))
    return sample


layouts = st.lists(st.lists(st.integers(1, 3), max_size=3), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(layouts, st.booleans())
def test_union_of_fields_holds_exactly_each_samples_rows(images_per_sample, mrope):
    samples = [make_sample(i, images, mrope) for i, images in enumerate(images_per_sample)]
    batch = collate_microbatch(samples, pad_length=None, vision_fields=DECLARED)
    assert {"pixel_values", "image_grid_thw"} <= set(batch)  # the same keys with or without any image
    assert batch["pixel_values"].dtype == torch.float32 and batch["pixel_values"].shape[1:] == (PATCH_DIM,)
    assert batch["image_grid_thw"].shape == (sum(len(i) for i in images_per_sample), 3)
    expected_rows = [s["pixel_values"].shape[0] if "pixel_values" in s else 0 for s in samples]
    assert batch[VISION_ROWS]["pixel_values"] == expected_rows
    longest = max(len(s["input_ids"]) for s in samples)
    assert batch["position_ids"].shape == ((len(samples), 3, longest) if mrope else (len(samples), longest))
    back = list(Uncollate(iter([batch]), image_token_id=IMAGE))
    for original, got in zip(samples, back):
        for name in ("input_ids", "labels", "position_ids"):
            assert torch.equal(got[name], original[name])
        if "pixel_values" in original:
            assert torch.equal(got["pixel_values"], original["pixel_values"])
            assert torch.equal(got["image_grid_thw"], original["image_grid_thw"])
        else:
            assert got["pixel_values"].shape == (0, PATCH_DIM) and got["image_grid_thw"].shape == (0, 3)


@pytest.mark.parametrize("order", ["text first", "text last", "text alone"])
def test_text_only_first_last_and_alone(order):
    text, image = make_sample(0, [], False), make_sample(1, [2, 1], False)
    samples = {"text first": [text, image], "text last": [image, text], "text alone": [text]}[order]
    batch = collate_microbatch(samples, pad_length=16, vision_fields=DECLARED)
    images = sum(1 for s in samples if s is image)
    assert batch["image_grid_thw"].shape == (2 * images, 3)
    assert batch["pixel_values"].shape == (image["pixel_values"].shape[0] * images, PATCH_DIM)
    undeclared = collate_microbatch(samples, pad_length=16)  # without a declaration: only fields some sample has
    assert ("pixel_values" in undeclared) == (images > 0)


def test_a_field_that_cannot_be_collated_names_the_sample_and_field():
    good, bad = make_sample(0, [1], False), make_sample(1, [1], False)
    bad["pixel_values"] = bad["pixel_values"].to(torch.float16)
    with pytest.raises(SampleError, match=r"sample 1, field 'pixel_values'.*float16"):
        collate_microbatch([good, bad], pad_length=None)
    extra = make_sample(2, [], False)
    extra["boxes"] = torch.zeros(2)
    with pytest.raises(SampleError, match=r"sample 0, field 'boxes': is missing"):
        collate_microbatch([good, extra], pad_length=None)
    mixed = make_sample(3, [], True)
    with pytest.raises(SampleError, match=r"sample 3, field 'position_ids'"):
        collate_microbatch([good, mixed], pad_length=None)
    scalar = make_sample(4, [], False)
    scalar["pixel_values"] = torch.tensor(1.0)
    with pytest.raises(SampleError, match=r"sample 4, field 'pixel_values'"):
        collate_microbatch([good, scalar], pad_length=None)
