"""`--exchange-payload rows` against `samples` through the recipe's graph, one process (DP 1): for every
family and both modules, with reordering off and on, the micro-batches are the same, bit for bit; each
module's micro-batches carry the fields module_fields declares; restoring the rows graph is exact."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from node_checks import assert_same, check_save_load_everywhere, load_into_loader, take
from PIL import Image

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.data.embedded.family_processors import FAMILIES, build_family_processor
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import RowProcessor
from mimo_pipes.samples.collate import METADATA_LIST_NAMES
from mimo_pipes.samples.module_fields import ENCODER_TOKEN_FIELDS, LAYOUT_FIELDS, PIXEL_FIELDS, TOKEN_FIELDS
from mimo_pipes_recipes import vlm_sft

ROWS = 16
COMPONENTS = ("language=dp=1", "images=dp=1,rank_offset=1")


def jpeg(height: int, width: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


def write_rows(folder, videos: bool) -> str:
    """A save_to_disk dataset: 0-2 images of varied sizes per row, text-only rows, video rows as frames."""
    import datasets

    rows = []
    for i in range(ROWS):
        images = [{"bytes": jpeg(30 + 37 * ((i + k) % 7), 40 + 53 * ((3 * i + k) % 5), 10 * i + k), "path": None} for k in range(i % 3)]
        frames = [{"bytes": jpeg(48, 64, 100 + i * 4 + f), "path": None} for f in range(3)] if videos and i % 5 == 4 else []
        rows.append({"prompt": f"what is in row {i}?", "response": f"row {i} shows {i % 4} boxes", "images": images,
                     "videos": [frames] if frames else []})
    features = datasets.Features({"prompt": datasets.Value("string"), "response": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image()), "videos": datasets.List(datasets.List(datasets.Image()))})
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def datasets_by_videos(tmp_path_factory):
    """The rows written once for the module, with and without video rows (every family reads the same files)."""
    root = tmp_path_factory.mktemp("rows")
    return {videos: write_rows(root / f"videos-{videos}", videos) for videos in (True, False)}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, datasets_by_videos):
    root = tmp_path_factory.mktemp(request.param)
    processor = str(build_family_processor(root / "processor", request.param))
    return request.param, processor, datasets_by_videos[request.param != "internvl"]


def config_for(family, payload: str, reorder: bool, window: int = 2) -> PipelineConfig:
    _, processor, dataset = family
    return PipelineConfig(
        components=COMPONENTS, micro_batch_size=4, seq_length=2048, dataloader_type="single", num_workers=2,
        processing="thread",  # both payloads alike; on worker processes across ranks: tests/distributed/test_payload_dist.py
        dataset=dataset, processor=processor, exchange_payload=payload,
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=reorder, reorder_window_size=window),
    )


def micro_batches(family, payload: str, module: str, reorder: bool) -> list[dict]:
    loader = vlm_sft.build(config_for(family, payload, reorder), RankLayout(0, 1, 1, module=module))
    try:
        return take(loader, None)
    finally:
        loader.close()


@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize("module", ["language", "images"])
def test_both_payloads_give_the_same_micro_batches(family, module, reorder):
    rows = micro_batches(family, "rows", module, reorder)
    assert len(rows) == ROWS // 4
    assert_same(rows, micro_batches(family, "samples", module, reorder))
    for batch in rows:
        assert set(METADATA_LIST_NAMES.values()) <= set(batch)  # pairing checks on both sides: ids, image counts
        assert any(name in batch for name in LAYOUT_FIELDS)
        dropped = PIXEL_FIELDS if module == "language" else tuple(set(TOKEN_FIELDS) - set(ENCODER_TOKEN_FIELDS))
        assert not any(name in batch for name in dropped), sorted(batch)
        kept = TOKEN_FIELDS if module == "language" else ("pixel_values", *ENCODER_TOKEN_FIELDS)
        assert all(name in batch for name in kept), sorted(batch)


def test_the_rows_graph_processes_after_the_exchange_and_restores_exactly(family):
    config = config_for(family, "rows", reorder=True)
    layout = RankLayout(0, 1, 1, module="language")
    loader = vlm_sft.build(config, layout)
    assert any(isinstance(node, RowProcessor) for node in _nodes(loader))
    loader.close()

    def fresh():
        return vlm_sft.build(config, layout)

    if family[0] == FAMILIES[0]:  # the graph's nodes and their state are the same for every family: every position once
        check_save_load_everywhere(fresh, restore=load_into_loader)
        return
    reference = take(fresh(), None)  # each other family's fields through one restore inside the first window
    assert len(reference) == ROWS // 4
    saver = fresh()
    take(saver, 1)
    state = saver.state_dict()
    saver.close()
    restored = fresh()
    load_into_loader(restored, state)
    assert_same(take(restored, None), reference[1:], f"{family[0]} restored after 1 micro-batch")


def test_a_samples_state_is_refused_by_the_rows_graph(family):
    layout = RankLayout(0, 1, 1, module="images")
    saved = vlm_sft.build(config_for(family, "samples", reorder=True), layout)
    next(saved)
    state = saved.state_dict()
    saved.close()
    with pytest.raises(ValueError, match="RowProcessor|BalanceExchange|MicroBatchAssembler"):
        vlm_sft.build(config_for(family, "rows", reorder=True), layout).load_state_dict(state)


def test_a_pipeline_given_processed_samples_moves_samples(family):
    config = dataclasses.replace(config_for(family, "rows", reorder=True))
    processor = vlm_sft.open_processor(config)
    from mimo_pipes.data.sources.open_source import open_source

    dataset = open_source(config.dataset)
    loader = vlm_sft.pipeline(dataset, config, RankLayout(0, 1, 1), map_fn=processor, image_token_id=processor.placeholder_ids,
                              pad_values={"input_ids": processor.pad_token_id}, vision_fields=processor.vision_fields)
    assert not any(isinstance(node, RowProcessor) for node in _nodes(loader))
    assert "pixel_values" in next(loader) and "input_ids" in next(loader)  # no module named: every field
    loader.close()


def _nodes(loader):
    from mimo_pipes.graph.traversal import graph_nodes

    return graph_nodes(loader.root)


@pytest.mark.parametrize(("workers", "counting"), [(1, 1), (8, 1), (9, 2), (14, 2), (17, 3)])
def test_rows_are_counted_on_a_few_threads_and_processed_on_every_worker(workers, counting):
    """Counting a row costs a small part of processing it: under the rows payload the counting mapper gets one
    thread per WORKERS_PER_COUNTING_WORKER workers (each more is one more thread beside the training thread),
    the row processing every worker; under the samples payload the mapper processes, on every worker."""
    from torchdata.nodes import ParallelMapper

    from mimo_pipes.config.workers import counting_workers

    assert counting_workers(workers) == counting
    for payload, mapper_threads in (("rows", counting), ("samples", workers)):
        config = PipelineConfig(components=("language=dp=1",), micro_batch_size=2, seq_length=2048, embedded_samples=16,
                                num_workers=workers, processing="thread", exchange_payload=payload)
        loader = vlm_sft.build(config, RankLayout(0, 1, 1))
        try:
            nodes = _nodes(loader)
            assert [node.num_workers for node in nodes if isinstance(node, ParallelMapper)] == [mapper_threads]
            assert [node.workers for node in nodes if isinstance(node, RowProcessor)] == ([workers] if payload == "rows" else [])
        finally:
            loader.close()


def test_under_processes_rows_are_counted_on_worker_processes_too():
    """processing="process": the counting before the exchange runs on a worker process per
    WORKERS_PER_COUNTING_WORKER workers, off the rank's interpreter lock (its warnings counted on the rank:
    test_worker_warnings.py), and the stream is the threads' one."""
    from torchdata.nodes import ParallelMapper

    def built(processing: str) -> tuple[list, list[dict]]:
        config = PipelineConfig(components=("language=dp=1",), micro_batch_size=2, seq_length=2048, embedded_samples=16,
                                num_workers=9, processing=processing, exchange_payload="rows", dataloader_type="single")
        loader = vlm_sft.build(config, RankLayout(0, 1, 1))
        try:
            mappers = [(node.method, node.num_workers) for node in _nodes(loader) if isinstance(node, ParallelMapper) and node.num_workers]
            return mappers, take(loader, None)
        finally:
            loader.close()

    mappers, batches = built("process")
    assert mappers == [("process", 2)]
    threads, reference = built("thread")
    assert threads == [("thread", 2)]
    assert_same(batches, reference)
