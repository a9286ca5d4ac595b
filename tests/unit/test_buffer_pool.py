"""BufferPool: micro-batch buffers are used again only once every tensor over them is gone."""

from __future__ import annotations

import gc

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.samples.buffer_pool import ROUND_BYTES, BufferPool


def test_a_buffer_comes_back_when_its_last_view_is_gone_and_is_used_again() -> None:
    pool = BufferPool()
    buffer = pool.take(1000, torch.float32)
    address = buffer.data_ptr()
    view = buffer[10:20].view(2, 5)  # what collation hands on: a view of the buffer
    del buffer
    assert pool.spare_buffers == 0  # the view still holds it
    other = pool.take(1000, torch.float32)
    assert other.data_ptr() != address
    del view
    assert pool.spare_buffers == 1
    again = pool.take(900, torch.float32)
    assert again.data_ptr() == address and again.numel() == 900 and again.dtype == torch.float32
    assert pool.made == 2


def test_a_larger_micro_batch_gets_a_buffer_of_its_own_and_spares_beyond_the_limit_are_let_go() -> None:
    pool = BufferPool(spare=2)
    small = [pool.take(10, torch.uint8) for _ in range(5)]
    del small
    gc.collect()
    assert pool.spare_buffers == 5  # given back on the dropping thread: nothing let go there
    large = pool.take(ROUND_BYTES // 2 + 1, torch.float32)  # 2 MiB + 4 bytes: none of the 1 MiB spares fits
    assert large.untyped_storage().nbytes() >= (ROUND_BYTES // 2 + 1) * 4
    assert pool.spare_buffers == 2  # the surplus went on the taking thread
    assert pool.made == 6


def test_cleared_pool_keeps_nothing_given_back() -> None:
    pool = BufferPool()
    lent = pool.take(64, torch.bfloat16)
    pool.clear()
    del lent
    assert pool.spare_buffers == 0
    pool.reopen()
    pool.take(64, torch.bfloat16)
    assert pool.made == 2


@settings(max_examples=40)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3 * ROUND_BYTES // 4), st.integers(0, 7)), min_size=1, max_size=30))
def test_no_live_tensor_ever_shares_memory_with_a_new_one(steps: list[tuple[bool, int, int]]) -> None:
    pool = BufferPool(spare=3)
    live: list[tuple[torch.Tensor, int]] = []
    for fill, (drop, numel, pick) in enumerate(steps):
        if drop and live:
            live.pop(pick % len(live))
        tensor = pool.take(numel, torch.float32)
        tensor.fill_(fill)
        live.append((tensor, fill))
        for held, value in live:  # every tensor still held kept what was written into it
            assert bool((held == value).all())

