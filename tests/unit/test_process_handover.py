"""Rows processed on worker processes (``processing="process"``) through the recipe's graph: the micro-batches are
the threads' (pixels bit for bit, also transformers' processor's on large images), the pixels come back in shared
memory without a copy (placed in their micro-batch's buffer), no segment outlives the run, and a row that fails
in a worker is the usual SampleError naming it. Starts worker processes: launch tier."""

from __future__ import annotations

import gc
import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

from mimo_pipes.config import PipelineConfig
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.module_processor import ModuleProcessor
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.processing.row_counter import RowCounter
from mimo_pipes.errors import SampleError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.traversal import graph_nodes
from mimo_pipes.nodes.row_processor import RowProcessor
from mimo_pipes.samples import handover
from mimo_pipes.samples.module_fields import module_fields
from mimo_pipes_recipes import vlm_sft

pytestmark = pytest.mark.launch
SEQ_LENGTH = 4096


def jpeg(height: int, width: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (height // 50 + 2, width // 50 + 2, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    coarse.resize((width, height), Image.BICUBIC).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def rows(bad: int | None = None) -> list[dict]:
    """Rows of 0-2 large images (a 12 MP photo, an A4 page at 300 dpi, smaller ones); row ``bad``'s image is broken."""
    sizes = [[(3000, 4000), (600, 800)], [], [(3508, 2480)], [(900, 1200), (1500, 1000)]] * 2
    out = []
    for index, images in enumerate(sizes):
        encoded = [{"bytes": jpeg(h, w, index * 10 + k), "path": None} for k, (h, w) in enumerate(images)]
        if index == bad:
            encoded = [{"bytes": b"\xff\xd8 not a jpeg", "path": None}]
        out.append({"id": index, "images": encoded, "prompt": "What is on the page?", "response": f"Answer {index}: a page of text."})
    return out


def loader(data: list[dict], method: str, payload: str = "rows"):
    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=4, seq_length=SEQ_LENGTH, num_workers=2, exchange_payload=payload)
    processor = load_processor(default_processor_path(), SEQ_LENGTH)
    fields = module_fields(None)
    map_fn, process_rows = (RowCounter(processor, fields).count, ModuleProcessor(processor, fields)) if payload == "rows" else (processor, None)
    return vlm_sft.pipeline(data, config, RankLayout(dp_rank=0, dp_size=1, grid_size=1), map_fn=map_fn,
                            image_token_id=processor.placeholder_ids, pad_values={"input_ids": processor.pad_token_id, "labels": -100},
                            vision_fields=processor.vision_fields, processing=method, process_rows=process_rows)


def take(data: list[dict], method: str, count: int, payload: str = "rows") -> list[dict]:
    graph = loader(data, method, payload)
    try:
        batches = iter(graph)
        return [next(batches) for _ in range(count)]
    finally:
        graph.close()


def mapped_segments() -> int:
    with open("/proc/self/maps") as maps:
        return sum(handover.SEGMENT_PREFIX in line for line in maps)


def assert_same(ours: list[dict], theirs: list[dict]) -> None:
    for mine, other in zip(ours, theirs, strict=True):
        assert list(mine) == list(other)
        for key, value in other.items():
            if isinstance(value, torch.Tensor):
                assert mine[key].dtype == value.dtype and torch.equal(mine[key], value), key
            else:
                assert mine[key] == value, key


def test_worker_processes_give_the_threads_microbatches_through_shared_memory():
    data = rows()
    threads, processes = take(data, "thread", 2), take(data, "process", 2)
    assert_same(processes, threads)
    for ours in processes:
        assert ours["pixel_values"]._base is not None  # a view of the micro-batch's buffer, written by the workers: no copy
    # The processor's own pixels for the rows of the first micro-batch, in its order, bit for bit.
    processor = load_processor(default_processor_path(), SEQ_LENGTH)
    images = [Image.open(io.BytesIO(item["bytes"])).convert("RGB") for sid in processes[0]["sample_ids"] for item in data[sid]["images"]]
    expected = processor.family.image_processor(images=images, return_tensors="np")["pixel_values"]
    assert np.array_equal(processes[0]["pixel_values"].numpy(), expected)
    assert not handover.segment_names(os.getpid())  # every segment's name gone once its rows were received
    del processes, ours
    gc.collect()
    assert mapped_segments() == 0  # and its memory with the last micro-batch that held it


def test_worker_processes_write_every_micro_batch_into_segments_used_again():
    graph = loader(rows(), "process")  # 8 rows, read again and again
    processor = next(node for node in graph_nodes(graph.root) if isinstance(node, RowProcessor))
    try:
        batches = iter(graph)
        taken = [next(batches)["sample_ids"] for _ in range(6)]  # each micro-batch dropped before the next is made
    finally:
        graph.close()
    assert len(taken) == 6 and all(len(ids) == 4 for ids in taken)
    # One segment per micro-batch in flight at most, not one per micro-batch (6): the rest were used again.
    assert 1 <= processor._segments.made < len(taken)
    del batches, graph, processor
    gc.collect()
    assert not handover.segment_names(os.getpid()) and mapped_segments() == 0  # closed: names and memory gone


def test_a_row_that_fails_in_a_worker_process_is_the_sample_error_naming_it():
    with pytest.raises(SampleError, match=r"dataset row 2: image 0 cannot be decoded"):
        take(rows(bad=2), "process", 2)
    gc.collect()
    assert not handover.segment_names(os.getpid()) and mapped_segments() == 0


def test_under_the_samples_payload_worker_processes_give_the_threads_microbatches():
    """torchdata's mapper of processes: each sample crosses in its own segment, and none is left named."""
    data = rows()[:4]
    assert_same(take(data, "process", 1, "samples"), take(data, "thread", 1, "samples"))
    gc.collect()
    assert not handover.segment_names(os.getpid()) and mapped_segments() == 0
