"""Samples handed over from worker processes through shared memory (samples/handover.py): what crosses
is equal to what was made, no copy on the receiving side, and no segment outlives its sample (received, dropped,
failed, swept); pixels placed straight into a micro-batch's buffer collate as that buffer."""

from __future__ import annotations

import gc
import os
import pickle

import pytest
import torch

from mimo_pipes.samples import handover
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import SAMPLE_ID, STEP

OTHER = os.getpid() + 1_000_000  # a process id that is not this one: samples are made "for" it


def mapped_segments() -> int:
    """Segments this process still maps (a received sample's memory, held by its tensors)."""
    with open("/proc/self/maps") as maps:
        return sum(handover.SEGMENT_PREFIX in line for line in maps)


def a_sample(sample_id: int = 3, patches: int = 700) -> dict:
    return {SAMPLE_ID: sample_id, "input_ids": torch.arange(50), "loss_mask": torch.ones(50), "flags": torch.tensor([True, False]),
            "pixel_values": torch.rand(patches, 1176), "image_grid_thw": torch.tensor([[1, 28, 25]]), "empty": torch.empty(0, 4),
            "kind": "photo", STEP: 0}


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    handover.sweep(OTHER)
    handover.sweep(os.getpid())


def test_a_sample_crosses_in_one_segment_and_unpickles_as_views_of_it():
    sample = a_sample()
    data = pickle.dumps(handover.for_caller(dict(sample), OTHER))
    assert len(data) < 2000 < sample["pixel_values"].numel()  # names and places, not the 3 MB of pixels
    assert len(handover.segment_names(OTHER)) == 1
    got = pickle.loads(data)
    assert type(got) is dict and list(got) == list(sample)
    assert not handover.segment_names(OTHER)  # the name goes as it is received
    for key, value in sample.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value)
        else:
            assert got[key] == value
    pixels = got["pixel_values"]
    del got
    gc.collect()
    assert mapped_segments() == 1 and float(pixels.sum()) == float(sample["pixel_values"].sum())  # held by the one tensor kept
    del pixels
    gc.collect()
    assert mapped_segments() == 0


def test_in_the_process_that_made_the_processor_nothing_is_wrapped():
    sample = a_sample()
    assert handover.for_caller(sample, os.getpid()) is sample
    assert isinstance(handover.for_caller(sample, OTHER), handover.HandedOver)


def test_a_sample_never_received_is_swept_and_a_failed_write_leaves_nothing(monkeypatch):
    pickle.dumps(handover.for_caller(a_sample(), OTHER))
    assert handover.sweep(OTHER, os.getpid()) == 1 and not handover.segment_names(OTHER)

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    sample = a_sample()
    got = pickle.loads(pickle.dumps(handover.for_caller(sample, OTHER)))  # no room: pickled whole instead
    assert not handover.segment_names(OTHER)
    assert torch.equal(got["pixel_values"], sample["pixel_values"]) and list(got) == list(sample)


def test_pixels_placed_in_a_microbatch_buffer_collate_as_the_buffer_itself():
    samples = [a_sample(0, 300), {**a_sample(1), "pixel_values": None}, a_sample(2, 200)]
    samples[1].pop("pixel_values")
    samples[1].pop("image_grid_thw")
    counts = [300, 0, 200]
    destination = handover.Destination(os.getpid(), counts, (1176,), torch.float32)
    received = []
    for sample, count, place, rows in zip(samples, counts, destination.places, destination.rows):
        sent = handover.placed(sample, "pixel_values", place if count else None)  # in the worker
        assert isinstance(sent.get("pixel_values"), handover.Placed) == bool(count)
        received.append(handover.received_rows(dict(sent), "pixel_values", rows))
        destination.row_done()
    assert not handover.segment_names(os.getpid())  # named only while its rows are processed
    batch = collate_microbatch(received, pad_length=64)
    expected = torch.cat([samples[0]["pixel_values"], samples[2]["pixel_values"]])
    assert torch.equal(batch["pixel_values"], expected)
    assert batch["pixel_values"].data_ptr() == destination.buffer.data_ptr()  # no copy: the buffer itself
    assert batch["vision_rows"]["pixel_values"] == counts


def test_a_sample_whose_rows_differ_from_its_count_keeps_its_own_and_is_copied():
    samples = [a_sample(0, 300), a_sample(1, 250)]
    destination = handover.Destination(os.getpid(), [300, 200], (1176,), torch.float32)  # the second counted 200, made 250
    received = []
    for sample, place, rows in zip(samples, destination.places, destination.rows):
        received.append(handover.received_rows(dict(handover.placed(sample, "pixel_values", place)), "pixel_values", rows))
        destination.row_done()
    assert received[1]["pixel_values"] is samples[1]["pixel_values"]
    batch = collate_microbatch(received, pad_length=64)
    assert torch.equal(batch["pixel_values"], torch.cat([s["pixel_values"] for s in samples]))
    assert batch["pixel_values"].data_ptr() != destination.buffer.data_ptr()
