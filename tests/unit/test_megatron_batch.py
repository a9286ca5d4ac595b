"""mimo_batch on micro-batches of the built-in processor: the keys of MimoModel.forward, in Megatron-Bridge's shapes."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from megatron_inputs import IMAGE, MERGE, START, VIDEO, microbatch, reference

from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.megatron import FORWARD_KEYS, MimoBatchSettings, fit_to_forward, for_stage, forward_support, mimo_batch, stage_of
from mimo_pipes.samples.collate import METADATA_LIST_NAMES, VISION_ROWS
from mimo_pipes.samples.thd import pack_microbatch

NAMES = ["several images", "text only", "one image"]


@pytest.fixture(scope="module")
def processor():
    return load_processor(default_processor_path(), 1024)


@pytest.fixture(scope="module")
def batch(processor):
    return microbatch(processor, NAMES, pad_length=160)


def test_the_defaults_give_forward_keys_in_bridge_shapes(batch):
    before = {name: value.clone() for name, value in batch.items() if isinstance(value, torch.Tensor)}
    kwargs = mimo_batch(batch)
    assert tuple(kwargs) == FORWARD_KEYS
    for name in ("input_ids", "labels", "loss_mask"):
        assert kwargs[name] is batch[name]
    assert kwargs["labels"][batch["attention_mask"] == 0].eq(-100).all()
    expected = reference("qwen2-vl", batch["input_ids"], image_grid_thw=batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    assert torch.equal(kwargs["position_ids"], expected) and kwargs["position_ids"].shape == (3, 3, 160)
    encoder = kwargs["modality_inputs"]["images"]["qwen_visual"]
    assert set(encoder) == {"hidden_states", "grid_thw"}
    assert encoder["hidden_states"] is batch["pixel_values"] and encoder["grid_thw"] is batch["image_grid_thw"]
    assert kwargs["attention_mask"] is None and kwargs["packing_kwargs"] is None
    assert all(torch.equal(before[name], batch[name]) for name in before)  # the micro-batch is left as it was
    assert set(METADATA_LIST_NAMES.values()) | {VISION_ROWS, "step"} <= set(batch)  # what was dropped was there


def test_a_packed_microbatch_gets_packing_kwargs_equal_to_the_pipeline_packing(batch):
    packed = pack_microbatch(batch, pad_multiple=8)
    kwargs = mimo_batch(packed)
    total = int(packed["cu_seqlens"][-1])
    assert kwargs["input_ids"].shape == (1, total) and kwargs["position_ids"].shape == (3, 1, total)
    assert kwargs["attention_mask"] is None
    p = kwargs["packing_kwargs"]
    assert torch.equal(p["cu_seqlens_q"], packed["cu_seqlens_unpadded"]) and torch.equal(p["cu_seqlens_kv"], packed["cu_seqlens_unpadded"])
    assert torch.equal(p["cu_seqlens_q_padded"], packed["cu_seqlens"]) and torch.equal(p["cu_seqlens_kv_padded"], packed["cu_seqlens"])
    assert p["cu_seqlens_q"].dtype == torch.int32 and p["max_seqlen_q"] == p["max_seqlen_kv"] == packed["max_seqlen"]
    real = packed["cu_seqlens_unpadded"]
    lengths = (real[1:] - real[:-1]).tolist()
    for k, start in enumerate(packed["cu_seqlens"][:-1].tolist()):  # padding between sequences: no loss
        pad = slice(start + lengths[k], int(packed["cu_seqlens"][k + 1]))
        assert kwargs["labels"][0, pad].eq(-100).all() and kwargs["loss_mask"][0, pad].eq(0).all()
    assert any(n % 8 for n in lengths)  # some sequence was padded: the padded and real forms differ
    assert not torch.equal(p["cu_seqlens_q"], p["cu_seqlens_q_padded"])


def test_the_boolean_mask_masks_later_and_padding_tokens(batch):
    mask = mimo_batch(batch, attention_mask="bool")["attention_mask"]
    rows, length = batch["attention_mask"].shape
    assert mask.shape == (rows, 1, length, length) and mask.dtype == torch.bool
    for row in range(rows):
        real = batch["attention_mask"][row].bool()
        for query in (0, 5, length - 1):
            allowed = (torch.arange(length) <= query) & real
            assert torch.equal(~mask[row, 0, query], allowed)


@pytest.mark.parametrize("stage, none", [
    ("only", set()), ("first", {"labels", "loss_mask"}), ("middle", {"input_ids", "modality_inputs", "labels", "loss_mask"}),
    ("last", {"input_ids", "modality_inputs"}),
])
def test_each_pipeline_stage_keeps_its_keys(batch, stage, none):
    kwargs = mimo_batch(batch, stage=stage)
    assert tuple(kwargs) == FORWARD_KEYS
    assert {key for key, value in kwargs.items() if value is None} - {"attention_mask", "packing_kwargs"} == none
    assert kwargs["position_ids"] is not None  # rotary positions are needed on every stage
    assert for_stage(mimo_batch(batch), stage).keys() == kwargs.keys()


def test_stage_of_a_pipeline_rank():
    assert [stage_of(r, 4) for r in range(4)] == ["first", "middle", "middle", "last"]
    assert stage_of(0, 1) == "only"
    with pytest.raises(ValueError, match="pipeline rank 2"):
        stage_of(2, 2)


def test_language_and_encoder_module_microbatches(batch):
    language = {k: v for k, v in batch.items() if k not in ("pixel_values", "pixel_values_videos")}
    kwargs = mimo_batch(language)
    assert kwargs["modality_inputs"] is None and kwargs["position_ids"].shape == (3, 3, 160)
    encoder = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask", "labels", "loss_mask", "position_ids")}
    kwargs = mimo_batch(encoder)
    assert kwargs["input_ids"] is None and kwargs["position_ids"] is None and kwargs["labels"] is None
    assert kwargs["modality_inputs"]["images"]["qwen_visual"]["grid_thw"] is batch["image_grid_thw"]
    assert mimo_batch(batch, encodes=False)["modality_inputs"] is None


def test_a_text_only_microbatch_has_no_modality_inputs(processor):
    text = microbatch(processor, ["text only", "text only"])
    assert text["pixel_values"].shape[0] == 0  # declared, empty
    kwargs = mimo_batch(text)
    assert kwargs["modality_inputs"] is None
    assert torch.equal(kwargs["position_ids"], text["position_ids"][None].expand(3, -1, -1))


def test_names_and_ids_are_options(batch):
    kwargs = mimo_batch(batch, modality="vision", encoder_key="tower", pixels_key="pixel_values", grid_key="image_grid_thw", mrope=False)
    assert set(kwargs["modality_inputs"]["vision"]["tower"]) == {"pixel_values", "image_grid_thw"}
    assert kwargs["position_ids"] is batch["position_ids"]
    settings = MimoBatchSettings(modality="vision")
    assert set(mimo_batch(batch, settings)["modality_inputs"]) == {"vision"}
    with pytest.raises(TypeError, match="unknown option.*encoder_name"):
        mimo_batch(batch, encoder_name="x")
    with pytest.raises(ValueError, match="stage must be one of"):
        mimo_batch(batch, stage="second")


def test_three_row_position_ids_become_megatrons_layout(batch):
    rows = dict(batch, position_ids=torch.arange(3 * 3 * 160).reshape(3, 3, 160))  # [b, 3, L] as a processor gives them
    kwargs = mimo_batch(rows, mrope=False)
    assert kwargs["position_ids"].shape == (3, 3, 160)
    assert torch.equal(kwargs["position_ids"][:, 1], rows["position_ids"][1])


def test_settings_for_a_processor_take_its_ids(processor):
    settings = MimoBatchSettings.for_processor(processor, stage="last")
    assert (settings.image_token_id, settings.video_token_id, settings.spatial_merge_size, settings.stage) == (processor.image_token_id, None, 2, "last")
    assert settings.image_token_id == MimoBatchSettings().image_token_id  # the defaults are the built-in processor's


def test_images_and_videos_reach_the_encoder_in_token_order():
    # sample 0: video then image; sample 1: image, video, image. Grids of each kind in their own order.
    image_grids, video_grids = [[1, 2, 4], [1, 4, 4], [1, 2, 2]], [[2, 2, 2], [1, 4, 2]]

    def block(token, grid):
        return [START] + [token] * (int(np.prod(grid)) // MERGE**2) + [4, 9]

    rows = [
        block(VIDEO, video_grids[0]) + block(IMAGE, image_grids[0]),
        block(IMAGE, image_grids[1]) + block(VIDEO, video_grids[1]) + block(IMAGE, image_grids[2]),
    ]
    length = max(map(len, rows)) + 3
    input_ids = torch.zeros((2, length), dtype=torch.int64)
    mask = torch.zeros_like(input_ids)
    for r, ids in enumerate(rows):
        input_ids[r, : len(ids)], mask[r, : len(ids)] = torch.tensor(ids), 1
    image_rows = [int(np.prod(g)) for g in image_grids]
    video_rows = [int(np.prod(g)) for g in video_grids]
    pixels = torch.arange(sum(image_rows)).float()[:, None].expand(-1, 4)
    videos = 1000 + torch.arange(sum(video_rows)).float()[:, None].expand(-1, 4)
    batch = {"input_ids": input_ids, "attention_mask": mask, "labels": input_ids, "loss_mask": mask.float(), "pixel_values": pixels,
             "image_grid_thw": torch.tensor(image_grids), "pixel_values_videos": videos, "video_grid_thw": torch.tensor(video_grids)}
    kwargs = mimo_batch(batch, video_token_id=VIDEO)
    encoder = kwargs["modality_inputs"]["images"]["qwen_visual"]
    order = [("v", 0), ("i", 0), ("i", 1), ("v", 1), ("i", 2)]
    grids = {"i": image_grids, "v": video_grids}
    assert encoder["grid_thw"].tolist() == [grids[kind][k] for kind, k in order]
    spans = {"i": np.cumsum([0, *image_rows]), "v": np.cumsum([0, *video_rows])}
    source = {"i": pixels, "v": videos}
    expected = torch.cat([source[kind][spans[kind][k] : spans[kind][k + 1]] for kind, k in order])
    assert torch.equal(encoder["hidden_states"], expected)
    positions = reference("qwen2-vl", input_ids, image_grid_thw=batch["image_grid_thw"], video_grid_thw=batch["video_grid_thw"], attention_mask=mask)
    assert torch.equal(kwargs["position_ids"], positions)
    without_ids = {k: v for k, v in batch.items() if k != "input_ids"}
    with pytest.raises(ValueError, match="needs input_ids to order them.*video_modality="):
        mimo_batch(without_ids, video_token_id=VIDEO)
    apart = mimo_batch(without_ids, video_token_id=VIDEO, video_modality="videos")["modality_inputs"]  # no order needed
    assert set(apart) == {"images", "videos"}
    assert apart["images"]["qwen_visual"]["hidden_states"] is pixels and apart["videos"]["qwen_visual"]["hidden_states"] is videos
    assert apart["videos"]["qwen_visual"]["grid_thw"].tolist() == video_grids
    only_videos = {k: v for k, v in batch.items() if k not in ("pixel_values", "image_grid_thw")}
    assert set(mimo_batch(only_videos, video_token_id=VIDEO, video_modality="videos", mrope=False)["modality_inputs"]) == {"videos"}


def test_tiles_without_a_grid_say_what_to_do(batch):
    tiles = {"input_ids": batch["input_ids"], "pixel_values": torch.zeros(3, 3, 8, 8), "image_num_tiles": torch.tensor([2, 0, 1]), "step": 4}
    with pytest.raises(ValueError, match="micro-batch 4: pixel_values without image_grid_thw.*encodes=False, mrope=False"):
        mimo_batch(tiles, mrope=False)
    assert mimo_batch(tiles, mrope=False, encodes=False)["modality_inputs"] is None


def test_a_mismatch_names_the_microbatch(batch):
    broken = dict(batch, image_grid_thw=batch["image_grid_thw"][:-1], step=7)
    with pytest.raises(ValueError, match="micro-batch 7: .*image"):
        mimo_batch(broken)


def test_fit_to_forward_keeps_what_the_signature_takes(batch):
    def forward_016(self, input_ids, position_ids=None, attention_mask=None, loss_mask=None, labels=None, modality_inputs=None):
        return None

    kwargs = fit_to_forward(mimo_batch(batch, mrope=False), forward_016, version="0.16.1")
    assert tuple(kwargs) == FORWARD_KEYS[:-1]
    with pytest.raises(ValueError, match="cannot take packing_kwargs"):
        fit_to_forward(mimo_batch(pack_microbatch(batch), mrope=False), forward_016, version="0.16.1")


def test_the_keys_are_parameters_of_the_installed_mimo_model_forward(batch):
    mimo = pytest.importorskip("megatron.core.models.mimo")
    if not hasattr(mimo, "MimoModel"):
        pytest.skip("this megatron-core has no MimoModel")
    parameters = inspect.signature(mimo.MimoModel.forward).parameters
    kwargs = fit_to_forward(mimo_batch(batch, mrope=forward_support().mrope_and_packing))
    assert set(kwargs) <= set(parameters) and set(FORWARD_KEYS) - set(kwargs) <= {"packing_kwargs"}
    inspect.signature(mimo.MimoModel.forward).bind(None, **kwargs)  # every key binds
    if forward_support().mrope_and_packing:
        assert fit_to_forward(mimo_batch(pack_microbatch(batch)))["packing_kwargs"] is not None
