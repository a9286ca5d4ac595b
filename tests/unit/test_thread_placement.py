"""Rows processed on worker threads (the default) write their pixels into one buffer made for their micro-batch:
the micro-batch's ``pixel_values`` is that buffer (no concatenation on the thread that hands micro-batches out),
bit for bit what concatenating the samples' own pixels gives and what the image processor gives; the pixel table
lays each row's pixels out in its slice of that buffer directly."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import torch
from PIL import Image
from test_process_handover import SEQ_LENGTH, assert_same, jpeg, take

from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing import fast_pixels
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.nodes import row_processor
from mimo_pipes.nodes.row_processor import RowProcessor
from mimo_pipes.samples import collate, pixel_destination
from mimo_pipes.samples.pixel_destination import pixels_into, take_destination


def small_rows() -> list[dict]:
    """Rows of 0-2 images of several sizes (one row text only), so micro-batches hold unequal pixel rows."""
    sizes = [[(300, 400), (120, 160)], [], [(351, 248)], [(90, 120), (150, 100)]] * 2
    return [{"id": index, "images": [{"bytes": jpeg(h, w, index * 10 + k), "path": None} for k, (h, w) in enumerate(images)],
             "prompt": "What is on the page?", "response": f"Answer {index}."} for index, images in enumerate(sizes)]


def test_thread_workers_write_pixels_into_the_microbatch_buffer_that_collates_without_a_copy(monkeypatch):
    data = small_rows()
    placed = take(data, "thread", 2)
    for batch in placed:
        base = batch["pixel_values"]._base
        assert base is not None and collate._LENT.get(id(base)) is base  # a view of the lent buffer, not a new tensor
    monkeypatch.setattr(RowProcessor, "_counts", lambda self, microbatch: None)  # each sample keeps its own pixels
    copied = take(data, "thread", 2)
    assert all(batch["pixel_values"]._base is None for batch in copied)  # concatenated: a tensor of its own
    assert_same(placed, copied)
    processor = load_processor(default_processor_path(), SEQ_LENGTH)
    images = [Image.open(io.BytesIO(item["bytes"])).convert("RGB") for sid in placed[0]["sample_ids"] for item in data[sid]["images"]]
    expected = processor.family.image_processor(images=images, return_tensors="np")["pixel_values"]
    assert np.array_equal(placed[0]["pixel_values"].numpy(), expected)
    assert placed[0]["pixel_values"].dtype == torch.float32


def test_fast_pixels_lay_each_rows_pixels_out_in_its_slice_of_the_buffer(monkeypatch):
    """The pixel table takes the slice RowProcessor offers (no array of the row's own, no copy after); withdrawn,
    the same micro-batches come out, bit for bit."""
    data = small_rows()
    taken: list[bool] = []
    offered = fast_pixels.take_destination

    def spied(shape, dtype):
        was_offered = pixel_destination._offer.target is not None  # the probe's calls, on building, have no offer
        target = offered(shape, dtype)
        if was_offered:
            taken.append(target is not None)
        return target

    monkeypatch.setattr(fast_pixels, "take_destination", spied)
    laid_out = take(data, "thread", 2)
    assert len(taken) >= sum(1 for row in data if row["images"]) and all(taken)  # every image row's, in place
    monkeypatch.setattr(row_processor, "pixels_into", lambda target: contextlib.nullcontext())
    taken.clear()
    copied = take(data, "thread", 2)
    assert not taken  # nothing offered
    assert_same(laid_out, copied)


def test_an_offer_of_another_shape_or_dtype_is_left_alone_and_an_offer_serves_one_call():
    family = load_processor(default_processor_path(), SEQ_LENGTH).family
    images = [Image.open(io.BytesIO(jpeg(300, 400, 1))).convert("RGB"), Image.open(io.BytesIO(jpeg(120, 160, 2))).convert("RGB")]
    expected, _ = family.pixel_table.pixels(images)
    for target in (np.full((expected.shape[0] + 1, expected.shape[1]), np.nan, dtype=np.float32),
                   np.full(expected.shape, np.nan, dtype=np.float64)):
        with pixels_into(target):
            pixels, _ = family.pixel_table.pixels(images)
        assert np.isnan(target).all() and np.array_equal(pixels, expected)  # not written, and the values the same
    target = np.full(expected.shape, np.nan, dtype=np.float32)
    with pixels_into(target):
        pixels, _ = family.pixel_table.pixels(images)
        again, _ = family.pixel_table.pixels(images)
    assert np.shares_memory(pixels, target) and np.array_equal(target, expected)
    assert not np.shares_memory(again, target) and np.array_equal(again, expected)  # the offer served one call
    assert take_destination(expected.shape, np.float32) is None  # withdrawn when the block ended


def test_a_slice_of_a_dtype_numpy_lacks_is_not_offered_and_the_pixels_are_copied_into_it():
    target = torch.zeros(2, 3, dtype=torch.bfloat16)
    sample = row_processor._process_into(lambda row: {"pixel_values": torch.ones(2, 3, dtype=torch.bfloat16)}, {}, target)
    assert sample["pixel_values"] is target and bool((target == 1).all())
