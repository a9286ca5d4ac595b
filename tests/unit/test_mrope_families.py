"""``MimoBatchSettings.for_processor`` on each Qwen-VL family's processor folder (built offline, laid out as a
downloaded one is) takes the family the folder names, and the positions ``mimo_batch`` computes with those
settings equal transformers' own ``get_rope_index`` of that family: images, videos, both, padded and packed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from megatron_inputs import image, reference, truncates_video_seconds
from megatron_inputs import microbatch as shared_microbatch

from mimo_pipes.data.embedded.family_processors import build_family_processor
from mimo_pipes.data.processing.family_names import folder_release, release_of
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.megatron import mimo_batch
from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.samples.thd import pack_microbatch

FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")


def video(frames: int, height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (frames, height, width, 3), dtype=np.uint8)


ROWS = {
    "text": dict(prompt="what is a box?", response="a thing with six sides"),
    "image": dict(prompt="describe it", response="a drawing", images=[image(60, 90)]),
    "video": dict(prompt="what happens?", response="it rolls away", videos=[video(4, 56, 84, 1)]),
    "image and videos": dict(prompt="compare", response="the second is longer", images=[image(40, 40, 2)],
                             videos=[video(3, 60, 60, 3), video(6, 30, 90, 4)]),
}


@pytest.fixture(scope="module")
def processors(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: load_processor(build_family_processor(root / family, family), 1024) for family in FAMILIES}


def microbatch(processor, names, pad_length=None):
    return shared_microbatch(processor, names, pad_length, rows=ROWS)  # this file's rows


def expected(family, batch, settings, attention_mask=None):
    """transformers' positions for the family; Qwen2.5-VL's seconds per video grid are its processor's for
    frames at 2 per second and a temporal patch of 2 (``temporal_patch_size / fps``), the settings' default."""
    grids = {name: batch[name] if batch.get(name) is not None and batch[name].numel() else None
             for name in ("image_grid_thw", "video_grid_thw")}
    videos = 0 if grids["video_grid_thw"] is None else grids["video_grid_thw"].shape[0]
    seconds = torch.full((videos,), settings.seconds_per_video_grid) if videos else None
    return reference(family, batch["input_ids"], **grids, attention_mask=attention_mask, tokens_per_second=settings.tokens_per_second,
                     seconds=seconds, image_token_id=settings.image_token_id, video_token_id=settings.video_token_id)


def skip_old_reference(family: str, names) -> None:
    if family == "qwen2.5-vl" and any("video" in name for name in names) and truncates_video_seconds():
        pytest.skip("transformers < 5.18 truncates seconds per video grid: the reference is 5.18's and later")


@pytest.mark.parametrize("family", FAMILIES)
def test_for_processor_takes_the_family_the_folder_names(processors, family):
    processor = processors[family]
    assert processor.family.name == family and family in repr(processor)
    assert MimoBatchSettings.for_processor(processor).mrope_family == family
    assert MimoBatchSettings.for_processor(processor, mrope_family="qwen2-vl").mrope_family == "qwen2-vl"  # options win


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize("family", FAMILIES)
def test_one_sample_equals_transformers(processors, family, name):
    skip_old_reference(family, [name])
    settings = MimoBatchSettings.for_processor(processors[family])
    batch = microbatch(processors[family], [name])
    assert torch.equal(mimo_batch(batch, settings)["position_ids"], expected(family, batch, settings))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_batch_of_images_and_videos_equals_transformers(processors, family):
    names = ["video", "text", "image and videos", "image"]
    skip_old_reference(family, names)
    settings = MimoBatchSettings.for_processor(processors[family])
    batch = microbatch(processors[family], names, pad_length=512)
    assert bool((batch["attention_mask"] == 0).any())
    got = mimo_batch(batch, settings)["position_ids"]
    assert torch.equal(got, expected(family, batch, settings, attention_mask=batch["attention_mask"]))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packed_batch_is_each_sequence_as_transformers_has_it_alone(processors, family):
    names = ["image and videos", "text", "video", "image"]
    skip_old_reference(family, names)
    processor = processors[family]
    settings = MimoBatchSettings.for_processor(processor)
    packed = pack_microbatch(microbatch(processor, names, pad_length=512), pad_multiple=8)
    got = mimo_batch(packed, settings)["position_ids"]
    starts, real = packed["cu_seqlens"].tolist(), packed["cu_seqlens_unpadded"].tolist()
    for k, name in enumerate(names):
        alone = microbatch(processor, [name])
        length = real[k + 1] - real[k]
        assert torch.equal(got[:, 0, starts[k] : starts[k] + length], expected(family, alone, settings)[:, 0]), name


def test_qwen3_vl_writes_each_video_frame_as_its_own_block_after_its_timestamp(processors):
    """As Qwen3VLProcessor does: ``<t seconds><|vision_start|>`` + a frame's placeholders + ``<|vision_end|>`` per
    temporal step, in place of the chat's one block (transformers' Qwen3-VL positions need the frames apart)."""
    processor = processors["qwen3-vl"]
    family = processor.family
    sample = processor(ROWS["video"])
    ids = sample["input_ids"].tolist()
    t, h, w = sample["video_grid_thw"][0].tolist()
    per_frame = h * w // family.merge_size**2
    starts = [k for k in range(len(ids) - 1) if ids[k] == family.vision_start_id and ids[k + 1] == family.video_token_id]
    assert len(starts) == t
    text = processor.tokenizer.decode(ids)
    for step in range(t):
        seconds = (2 * step * family.temporal_patch_size + family.temporal_patch_size - 1) / 2 / 2.0
        assert f"<{seconds:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_frame + "<|vision_end|>" in text
    assert "<|vision_start|><|vision_start|>" not in text
    other = processors["qwen2.5-vl"](ROWS["video"])["input_ids"].tolist()
    assert other.count(family.video_token_id) == ids.count(family.video_token_id) == t * per_frame
    assert other.count(family.vision_start_id) == 1  # Qwen2/2.5-VL: one block per video


def test_a_folder_that_names_no_release_is_refused_for_videos_unless_told(tmp_path):
    folder = build_family_processor(tmp_path / "bare", "qwen2.5-vl")
    (folder / "processor_config.json").write_text(json.dumps({}))
    processor = load_processor(folder, 1024)
    assert processor.family.release is None and "release not named" in processor.family.name
    with pytest.raises(ValueError, match=r"^mimo_batch: the processor folder .* does not say which Qwen-VL release it is.*pass mrope_family="):
        MimoBatchSettings.for_processor(processor)
    assert MimoBatchSettings.for_processor(processor, mrope_family="qwen2.5-vl").mrope_family == "qwen2.5-vl"
    assert MimoBatchSettings.for_processor(processor, mrope=False).mrope is False


@pytest.mark.parametrize(("file", "content", "release"), [
    ("processor_config.json", {"processor_class": "Qwen2_5_VLProcessor"}, "qwen2.5-vl"),
    ("preprocessor_config.json", {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}, "qwen2.5-vl"),
    ("preprocessor_config.json", {"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"}, "qwen3-vl"),
    ("tokenizer_config.json", {"processor_class": "Qwen2VLProcessor"}, "qwen2-vl"),
    ("video_preprocessor_config.json", {"video_processor_type": "Qwen3VLVideoProcessor"}, "qwen3-vl"),
    ("video_preprocessor_config.json", {"video_processor_type": "Qwen2VLVideoProcessor"}, None),  # Qwen2.5-VL's folders say so too
    ("config.json", {"model_type": "qwen2_5_vl"}, "qwen2.5-vl"),
    ("config.json", {"model_type": "qwen3_vl"}, "qwen3-vl"),
    ("preprocessor_config.json", {"image_processor_type": "Qwen2VLImageProcessor"}, None),  # every release's image processor
])
def test_the_release_is_read_from_what_a_folder_says_of_itself(tmp_path, file, content, release):
    (tmp_path / file).write_text(json.dumps(content))
    assert folder_release(tmp_path, {}) == release


def test_release_names():
    assert [release_of(name) for name in ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor", "InternVLProcessor", None)] == [
        "qwen2-vl", "qwen2.5-vl", "qwen3-vl", None, None]


def test_a_tile_family_keeps_one_position_per_token(tmp_path):
    """InternVL rotates by one position per token: for_processor does not compute M-RoPE positions for it."""
    processor = load_processor(build_family_processor(tmp_path / "internvl", "internvl"), 1024)
    settings = MimoBatchSettings.for_processor(processor, encodes=False)
    assert settings.mrope is False
    batch = microbatch(processor, ["text", "image"])
    assert torch.equal(mimo_batch(batch, settings)["position_ids"], batch["position_ids"])
