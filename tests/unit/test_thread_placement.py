"""Rows processed on worker threads (the default) write their pixels into one buffer made for their micro-batch:
the micro-batch's ``pixel_values`` is that buffer (no concatenation on the thread that hands micro-batches out),
bit for bit what concatenating the samples' own pixels gives and what the image processor gives."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image
from test_process_handover import SEQ_LENGTH, assert_same, jpeg, take

from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.nodes.row_processor import RowProcessor
from mimo_pipes.samples import collate


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
