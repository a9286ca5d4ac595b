"""copy_into: a worker's copy on its own thread gives the bytes torch's copy_ gives, for every dtype and layout."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.samples.worker_copy import copy_into

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 7), min_size=0, max_size=3), seed=st.integers(0, 2**31 - 1),
       transposed=st.booleans())
def test_copy_into_gives_the_bytes_copy_gives(dtype: torch.dtype, shape: list[int], seed: int, transposed: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    value = torch.randint(0, 256, shape, generator=generator, dtype=torch.int64).to(dtype)
    if transposed and value.dim() >= 2:  # not contiguous: torch's copy_ makes it
        value = value.transpose(0, 1)
    target = torch.full(value.shape, 7, dtype=dtype)
    expected = torch.empty_like(target).copy_(value)
    copy_into(target, value)
    assert torch.equal(target.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8))  # bit for bit


def test_copy_into_a_slice_of_a_buffer_leaves_the_rest() -> None:
    buffer = torch.zeros(10, 3)
    value = torch.arange(12, dtype=torch.float32).view(4, 3)
    copy_into(buffer[3:7], value)
    assert torch.equal(buffer[3:7], value)
    assert not buffer[:3].any() and not buffer[7:].any()


def test_copy_into_refuses_another_shape_or_dtype() -> None:
    with pytest.raises(ValueError, match="differ"):
        copy_into(torch.empty(2, 3), torch.empty(3, 2))
    with pytest.raises(ValueError, match="differ"):
        copy_into(torch.empty(2, 3), torch.empty(2, 3, dtype=torch.float64))
