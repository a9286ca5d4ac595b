"""Masked samples (rows payload, --skip-bad-samples): what stands in for a row that fails after the exchange
has the shapes its cost was counted for, in every family; a masked copy teaches nothing; a one-process graph
(every field) masks a whole PNG whose compressed data is corrupt and hands out every other sample as it was."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mimo_pipes.data.embedded.family_processors import FAMILIES, build_family_processor
from mimo_pipes.data.processing.module_processor import ModuleProcessor
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.processing.row_counter import RowCounter
from mimo_pipes.samples.masking import IGNORED_LABEL, MASKED, mask_failed, masked
from mimo_pipes.samples.module_fields import module_fields
from mimo_pipes.samples.sample import SAMPLE_ID, STEP


def _png(height: int, width: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _corrupt_inside(png: bytes) -> bytes:
    """``png`` whole (chunks framed, CRCs right) with image data that is no zlib stream."""
    out, position = png[:8], 8
    while position < len(png):
        length = struct.unpack(">I", png[position : position + 4])[0]
        kind, data = png[position + 4 : position + 8], png[position + 8 : position + 8 + length]
        if kind == b"IDAT":
            data = bytes(np.random.default_rng(1).integers(0, 256, len(data), dtype=np.uint8))
        out += struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        position += 12 + length
    return out


def _row(sample_id: int, sizes: list[tuple[int, int]], video: bool) -> dict:
    images = [{"bytes": _png(h, w, sample_id * 10 + k), "path": None} for k, (h, w) in enumerate(sizes)]
    frames = [{"bytes": _png(48, 64, 100 + f), "path": None} for f in range(3)] if video else []
    return {"prompt": f"what is in row {sample_id}?", "response": f"row {sample_id} shows boxes", "images": images,
            "videos": [frames] if frames else [], SAMPLE_ID: sample_id, STEP: 0}


@pytest.fixture(scope="module", params=FAMILIES)
def processor(request, tmp_path_factory):
    return request.param, load_processor(build_family_processor(tmp_path_factory.mktemp(request.param), request.param), 4096)


@pytest.mark.parametrize("video", [False, True])
def test_the_stand_in_has_the_counted_shapes_and_blank_pixels(processor, video):
    family, sample_processor = processor
    if video and family == "internvl":
        pytest.skip("internvl takes no videos")
    row = _row(3, [(61, 90), (150, 45)], video)
    encoder = ModuleProcessor(sample_processor, module_fields("images"))
    counted = RowCounter(sample_processor, module_fields("images")).count(row)
    real, stand_in = encoder(counted), encoder.stand_in(counted)
    assert set(stand_in) == set(real)
    for name, value in real.items():
        if isinstance(value, torch.Tensor):
            assert stand_in[name].shape == value.shape and stand_in[name].dtype == value.dtype, name
    for name in ("image_grid_thw", "video_grid_thw", "image_num_tiles"):
        if name in real:
            assert torch.equal(stand_in[name], real[name]), name
    # Blank: every patch row (or tile) is what the family makes of black.
    pixels = stand_in["pixel_values"]
    assert not torch.equal(pixels, real["pixel_values"])
    assert torch.equal(pixels, pixels[:1].expand_as(pixels))
    # The language module needs no pixel: its stand-in is the row's own fields.
    language = ModuleProcessor(sample_processor, module_fields("language"))
    counted = RowCounter(sample_processor, module_fields("language")).count(row)
    own, stand_in = language(counted), language.stand_in(counted)
    assert set(own) == set(stand_in) and all(torch.equal(own[k], stand_in[k]) for k in own if isinstance(own[k], torch.Tensor))


def test_a_masked_copy_teaches_nothing_and_keeps_its_shapes():
    sample = {"input_ids": torch.arange(6), "labels": torch.tensor([1, 2, -100, 4, 5, -100]), "loss_mask": torch.ones(6),
              "pixel_values": torch.ones(4, 3), SAMPLE_ID: 7, STEP: 2}
    out = masked(sample, "image 0 cannot be decoded")
    assert torch.all(out["labels"] == IGNORED_LABEL) and torch.all(out["loss_mask"] == 0)
    assert out["labels"].shape == (6,) and torch.equal(out["input_ids"], sample["input_ids"])
    assert torch.equal(out["pixel_values"], sample["pixel_values"]) and out[MASKED] == "image 0 cannot be decoded"
    assert sample["labels"][0] == 1 and MASKED not in sample  # the original is untouched


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=5), min_size=1, max_size=4),
       st.sets(st.tuples(st.integers(0, 3), st.integers(0, 9)), max_size=6))
def test_exactly_the_failed_positions_are_masked(positions, failed):
    microbatches = [[{STEP: step, SAMPLE_ID: sid, "labels": torch.tensor([1, 2])} for step, sid in mb] for mb in positions]
    reasons = {position: f"why {position}" for position in failed}
    count = mask_failed(microbatches, reasons)
    flat = [sample for mb in microbatches for sample in mb]
    assert count == sum((s[STEP], s[SAMPLE_ID]) in failed for s in flat)
    for sample in flat:
        position = (sample[STEP], sample[SAMPLE_ID])
        assert sample[MASKED] == reasons.get(position)
        assert bool(torch.all(sample["labels"] == IGNORED_LABEL)) == (position in failed)


def test_one_process_graph_masks_a_whole_file_that_fails_to_decode(tmp_path):
    """Every field in one graph (DP 1, no agreement group): the row is counted from its header, fails where
    it is decoded, and its sample is handed out masked, blank and with every label ignored."""
    import json

    from mimo_pipes.config import PipelineConfig, ReorderConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes_recipes import vlm_sft

    processor = build_family_processor(tmp_path / "processor", "qwen2-vl")
    images = tmp_path / "images"
    images.mkdir()
    rows = []
    for i in range(8):
        name = f"{i}.png"
        data = _png(56 + 8 * i, 84, i)
        (images / name).write_bytes(_corrupt_inside(data) if i == 5 else data)
        rows.append({"images": [name], "conversations": [{"from": "human", "value": "<image>\nwhat is it?"},
                                                           {"from": "gpt", "value": f"picture {i}"}]})
    spec = tmp_path / "data.jsonl"
    spec.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = PipelineConfig(
        components=("language=dp=1", "images=dp=1,rank_offset=1"), micro_batch_size=4, seq_length=512, dataloader_type="single",
        dataset=str(spec), image_folder=str(images), processor=str(processor), exchange_payload="rows", skip_bad_samples=True,
        seed=3, reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2),
    )
    loader = vlm_sft.build(config, RankLayout(0, 1, 1))
    try:
        batches = [next(loader) for _ in range(2)]
    finally:
        loader.close()
    held = [(sid, why, b) for b in batches for sid, why in zip(b["sample_ids"], b[MASKED])]
    assert sorted(sid for sid, _, _ in held) == list(range(8))
    for sid, why, batch in held:
        index = batch["sample_ids"].index(sid)
        labels = batch["labels"][index]
        if sid == 5:
            assert why is not None and "cannot be decoded" in why
            assert torch.all(labels == IGNORED_LABEL)
        else:
            assert why is None and torch.any(labels != IGNORED_LABEL)
    # The masked sample's pixels are blank, with the rows its grid counts.
    batch = next(b for b in batches if 5 in b["sample_ids"])
    index = batch["sample_ids"].index(5)
    rows_per_sample = batch["vision_rows"]["pixel_values"]
    start = sum(rows_per_sample[:index])
    pixels = batch["pixel_values"][start : start + rows_per_sample[index]]
    assert rows_per_sample[index] == int(batch["image_grid_thw"][index].prod())
    assert torch.equal(pixels, pixels[:1].expand_as(pixels))
