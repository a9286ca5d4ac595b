"""SegmentPool: worker processes' micro-batch segments are used again only once every view of them is gone, keep
their names only while the pool holds them, and a Destination made from the pool keeps its segment while any of
its rows may still be written."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

from mimo_pipes.samples import handover
from mimo_pipes.samples.buffer_pool import ROUND_BYTES
from mimo_pipes.samples.segment_pool import SegmentPool


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    gc.collect()
    handover.sweep(os.getpid())


def test_a_segment_comes_back_when_its_last_view_is_gone_and_is_used_again() -> None:
    pool = SegmentPool(os.getpid())
    segment, lent = pool.take(1000)
    view = torch.from_numpy(lent)[10:20]  # what collation hands on: a view of the segment's bytes
    del lent
    assert pool.spare_segments == 0  # the view still holds it
    other, lent_other = pool.take(1000)
    assert other.name != segment.name
    del view
    assert pool.spare_segments == 1
    again, lent_again = pool.take(900)
    assert again.name == segment.name and lent_again.nbytes == 900
    assert pool.made == 2 and segment.size == ROUND_BYTES
    assert sorted(handover.segment_names(os.getpid())) == sorted([segment.name, other.name])  # named while pooled


def test_spares_beyond_the_limit_lose_their_names_on_the_taking_thread() -> None:
    pool = SegmentPool(os.getpid(), spare=2)
    taken = [pool.take(10) for _ in range(5)]
    del taken
    gc.collect()
    assert pool.spare_segments == 5 and len(handover.segment_names(os.getpid())) == 5
    large, lent = pool.take(ROUND_BYTES + 1)  # none of the 1 MiB spares fits
    assert large.size == 2 * ROUND_BYTES
    assert pool.spare_segments == 2 and len(handover.segment_names(os.getpid())) == 3  # two spares and the large one


def test_clear_removes_every_name_and_a_segment_lent_across_it_is_not_pooled_again() -> None:
    pool = SegmentPool(os.getpid())
    kept, lent = pool.take(100)
    spare = pool.take(100)
    del spare
    assert pool.spare_segments == 1
    pool.clear()
    assert not handover.segment_names(os.getpid())  # the workers are gone: no name is needed
    lent[:4] = [1, 2, 3, 4]  # the lent segment's memory is still there
    assert list(lent[:4]) == [1, 2, 3, 4]
    pool.reopen()
    del lent
    assert pool.spare_segments == 0  # its name is gone: workers could not open it again
    fresh, _ = pool.take(100)
    assert fresh.name != kept.name and handover.segment_names(os.getpid()) == [fresh.name]


def test_a_pooled_destination_keeps_its_segment_while_it_lives_and_its_rows_collate_as_its_buffer() -> None:
    pool = SegmentPool(os.getpid())
    destination = handover.Destination(os.getpid(), [3, 0, 2], (6,), torch.float32, pool=pool)
    for place, count in zip(destination.places, [3, 0, 2]):
        if count:  # as a worker process writes its row: the slice mapped alone, the pixels laid out there
            target = handover.place_target(place)
            assert target.shape == (count, 6) and target.dtype == np.float32
            target[:] = np.arange(count * 6, dtype=np.float32).reshape(count, 6) + 100 * place.offset
            sample = handover.placed({"pixel_values": torch.from_numpy(target)}, "pixel_values", place, target)
            assert sample["pixel_values"] == place  # laid out in place: nothing left to copy
            del target, sample
    first = destination.rows[0].clone()
    assert torch.equal(first, torch.arange(18, dtype=torch.float32).reshape(3, 6))
    assert torch.equal(destination.rows[2], torch.arange(12, dtype=torch.float32).reshape(2, 6) + 100 * 72)
    destination.row_done()
    assert handover.segment_names(os.getpid()) == [destination.name]  # pooled: the name stays for the next micro-batch
    rows = destination.rows
    del rows
    assert pool.spare_segments == 0  # the Destination (held by its rows' futures until they end) keeps it
    del destination
    gc.collect()
    assert pool.spare_segments == 1


def test_a_row_made_elsewhere_is_copied_into_its_place_in_any_dtype() -> None:
    pool = SegmentPool(os.getpid())
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        destination = handover.Destination(os.getpid(), [4], (5,), dtype, pool=pool)
        made = torch.randn(4, 5).to(dtype)
        sent = handover.placed({"pixel_values": made}, "pixel_values", destination.places[0])
        assert isinstance(sent["pixel_values"], handover.Placed)
        assert torch.equal(destination.rows[0], made), dtype
        wrong = handover.placed({"pixel_values": made[:3]}, "pixel_values", destination.places[0])
        assert wrong["pixel_values"] is not None and torch.equal(wrong["pixel_values"], made[:3])  # another shape: kept
