"""check_collatable, run before the exchange, refuses exactly the samples whose collation would fail."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.errors import SampleError
from mimo_pipes.samples.checks import check_collatable
from mimo_pipes.samples.collate import collate_microbatch


@st.composite
def samples(draw):
    count = draw(st.integers(1, 4))
    width = draw(st.sampled_from([3, 4]))
    out = []
    for index in range(count):
        length = draw(st.integers(1, 12))
        ids = torch.arange(length) if draw(st.integers(0, 9)) else torch.zeros((2, length), dtype=torch.int64)
        rows = draw(st.integers(0, 3))
        pixels = torch.ones((rows, width if draw(st.integers(0, 9)) else width + 1))
        out.append({"sample_id": index, "step": 0, "input_ids": ids, "attention_mask": torch.ones(length, dtype=torch.int64),
                    "pixel_values": pixels})
    return out


@settings(max_examples=200, deadline=None)
@given(samples(), st.one_of(st.none(), st.integers(1, 12)))
def test_check_refuses_exactly_what_collation_cannot_do(batch, pad_length):
    try:
        check_collatable(batch, pad_length)
        refused = None
    except SampleError as error:
        refused = error
    if refused is None:
        collate_microbatch(batch, pad_length=pad_length)
    else:
        with pytest.raises((SampleError, RuntimeError)):
            collate_microbatch(batch, pad_length=pad_length)
        assert refused.field in ("input_ids", "attention_mask", "pixel_values")
