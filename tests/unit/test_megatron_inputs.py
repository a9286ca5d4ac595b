"""mimo_batch refuses a malformed micro-batch where it enters: one MimoBatchError, ``mimo_batch: micro-batch N: ``
and the field, never a bare error from inside the M-RoPE or vision code, never a silent pass."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron_inputs import IMAGE, MERGE, START, VIDEO, microbatch, reference

from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.megatron import MimoBatchError, mimo_batch
from mimo_pipes.samples.thd import pack_microbatch

GRID = [1, 4, 12]  # 48 patches, 12 placeholder tokens after the 2 x 2 merge
ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.complex64]


@pytest.fixture(scope="module")
def real():
    return microbatch(load_processor(default_processor_path(), 1024), ["several images", "text only", "one image"], pad_length=160)


def one_image(step: int = 6, grid=GRID, rows: int | None = None, dim: int = 8) -> dict:
    """Two rows, the first with one image of ``grid`` (``rows`` patch rows: by default as many as it describes)."""
    tokens = int(np.prod(grid)) // MERGE**2
    ids = torch.zeros((2, tokens + 6), dtype=torch.int64)
    ids[0, : tokens + 3] = torch.tensor([START, *[IMAGE] * tokens, 4, 9])
    ids[1, :4] = torch.tensor([7, 8, 9, 10])
    mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100), "loss_mask": mask.float(),
            "pixel_values": torch.randn(int(np.prod(grid)) if rows is None else rows, dim), "image_grid_thw": torch.tensor([grid]), "step": step}


def refused(batch, field: str | None, words: str, **options) -> MimoBatchError:
    with pytest.raises(MimoBatchError) as caught:
        mimo_batch(batch, **options)
    error = caught.value
    message = str(error)
    step = batch.get("step", "?") if isinstance(batch, dict) else "?"
    assert message.startswith(f"mimo_batch: micro-batch {step}: "), message
    assert words in message and "\n" not in message, message
    if field is not None:
        assert field in message.split(": ", 2)[2] and error.field == field, message
    assert isinstance(error, ValueError) and isinstance(error, TypeError)  # whichever a caller catches
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)  # one exception, not a chain
    assert str(pickle.loads(pickle.dumps(error))) == message  # crosses a worker process as it is
    return error


def test_the_hand_built_batch_is_valid_and_matches_transformers():
    batch = one_image()
    kwargs = mimo_batch(batch)
    assert torch.equal(kwargs["position_ids"], reference("qwen2-vl", batch["input_ids"], image_grid_thw=batch["image_grid_thw"],
                                                         attention_mask=batch["attention_mask"]))


@pytest.mark.parametrize("value", [[1, 2], (1,), "batch", None, 3, torch.zeros(2, 3)])
def test_a_micro_batch_that_is_not_a_mapping(value):
    refused(value, None, f"must be a mapping of field names to tensors (a micro-batch as the loader yields it), got a "
                         f"{'torch.' if isinstance(value, torch.Tensor) else ''}{type(value).__name__}")


@pytest.mark.parametrize("name", ["input_ids", "labels", "attention_mask", "loss_mask", "image_grid_thw", "pixel_values"])
@pytest.mark.parametrize("convert, kind", [(lambda t: t.tolist(), "a list"), (lambda t: t.numpy(), "a numpy.ndarray"),
                                           (lambda t: tuple(t.tolist()), "a tuple")])
def test_fields_that_are_not_tensors(name, convert, kind):
    batch = one_image()
    batch[name] = convert(batch[name])
    refused(batch, name, f"{name} must be a torch.Tensor, got {kind}")


@pytest.mark.parametrize("name", ["input_ids", "labels"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_token_ids_and_labels_are_int32_or_int64_only(name, dtype):
    batch = one_image()
    batch[name] = batch[name].to(dtype)
    if dtype in (torch.int32, torch.int64):
        assert mimo_batch(batch)[name] is batch[name]
    else:
        refused(batch, name, f"{name} must be int32 or int64, got {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.complex64])
def test_an_attention_mask_is_integer_or_bool(dtype):
    batch = one_image()
    assert mimo_batch(dict(batch, attention_mask=batch["attention_mask"].bool())) is not None
    refused(dict(batch, attention_mask=batch["attention_mask"].to(dtype)), "attention_mask", f"got {dtype}")


@pytest.mark.parametrize("name, change", [
    ("input_ids", lambda t: t[0]), ("input_ids", lambda t: t[None]), ("labels", lambda t: t[:1]), ("labels", lambda t: t[:, :-1]),
    ("attention_mask", lambda t: torch.cat([t, t[:, :1]], dim=1)), ("loss_mask", lambda t: t.T), ("attention_mask", lambda t: t[None]),
])
def test_token_fields_of_another_shape(name, change):
    batch = one_image()
    batch[name] = change(batch[name])
    refused(batch, name, f"{name} ")


def test_position_ids_read_without_mrope_are_checked(real):
    rows, length = real["input_ids"].shape
    assert mimo_batch(dict(real, position_ids=torch.zeros(3, rows, length, dtype=torch.int64)), mrope=False) is not None
    refused(dict(real, position_ids=torch.zeros(rows, 2, length, dtype=torch.int64)), "position_ids", "it must be", mrope=False)
    refused(dict(real, position_ids=real["position_ids"].float()), "position_ids", "int32 or int64", mrope=False)
    assert mimo_batch(dict(real, position_ids=real["position_ids"].float())) is not None  # computed with mrope: not read


def test_an_encoder_micro_batch_without_input_ids_takes_its_shape_from_its_first_token_field():
    batch = {k: v for k, v in one_image().items() if k != "input_ids"}
    assert mimo_batch(batch, mrope=False)["input_ids"] is None
    refused(dict(batch, labels=batch["labels"][:, 1:]), "labels", "but attention_mask is", mrope=False)


@pytest.mark.parametrize("grid, words", [
    (torch.tensor(GRID), "got torch.int64 of shape (3,)"),
    (torch.tensor([GRID[:2]]), "of shape (1, 2)"),
    (torch.tensor([[*GRID, 1]]), "of shape (1, 4)"),
    (torch.tensor([GRID]).float(), "got torch.float32"),
    (torch.tensor([GRID]).bool(), "got torch.bool"),
    (torch.tensor([[0, 4, 12]]), "row below 1"),
    (torch.tensor([[1, 4, -12]]), "row below 1"),
    (torch.tensor([[1, 3, 16]]), "not multiples of spatial_merge_size 2"),
])
def test_bad_grids(grid, words):
    refused(dict(one_image(), image_grid_thw=grid), "image_grid_thw", words)


@pytest.mark.parametrize("rows", [44, 47, 49, 96, 0])
def test_patch_rows_must_be_what_the_grid_describes(rows):
    refused(one_image(rows=rows), "image_grid_thw", f"describes 48 patches but the micro-batch has {rows} rows of pixel_values")


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_pixel_values_are_floating_point(dtype):
    batch = one_image()
    batch["pixel_values"] = batch["pixel_values"].to(dtype)
    if dtype.is_floating_point:
        assert mimo_batch(batch)["modality_inputs"]["images"]["qwen_visual"]["hidden_states"] is batch["pixel_values"]
    else:
        refused(batch, "pixel_values", f"pixel_values must be floating point (pixels as the processor normalises them), got {dtype}")


def test_pixel_values_beside_a_grid_are_patch_rows():
    batch = one_image()
    refused(dict(batch, pixel_values=batch["pixel_values"].reshape(-1)), "pixel_values", "must be [patches, patch dim]")
    refused(dict(batch, pixel_values=batch["pixel_values"][None]), "pixel_values", "must be [patches, patch dim]")
    refused(dict(batch, pixel_values=torch.tensor(1.0)), "pixel_values", "got a 0-d tensor")


def video_batch(rows: int | None = None, dtype=torch.float32) -> dict:
    grid = [2, 4, 4]
    tokens = int(np.prod(grid)) // MERGE**2
    ids = torch.tensor([[START, *[VIDEO] * tokens, 4, 9]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values_videos": torch.zeros(32 if rows is None else rows, 8, dtype=dtype),
            "video_grid_thw": torch.tensor([grid]), "step": 3}


def test_video_fields_are_checked_alike():
    assert mimo_batch(video_batch(), video_token_id=VIDEO) is not None
    refused(video_batch(rows=30), "video_grid_thw", "describes 32 patches but the micro-batch has 30 rows of pixel_values_videos", video_token_id=VIDEO)
    refused(video_batch(dtype=torch.int64), "pixel_values_videos", "must be floating point", video_token_id=VIDEO)
    refused(dict(video_batch(), video_grid_thw=torch.tensor([2.0, 4.0, 4.0])), "video_grid_thw", "[videos, 3]", video_token_id=VIDEO)


def test_a_video_micro_batch_with_default_settings_names_the_video_token_setting():
    error = refused(video_batch(), "video_grid_thw", "video_token_id is None")
    assert "pass video_token_id=" in str(error) and "MimoBatchSettings.for_processor(processor)" in str(error)
    assert mimo_batch(video_batch(), mrope=False)["modality_inputs"] is not None  # no placeholders to find: nothing needed
    both = dict(one_image(step=3), **{k: v for k, v in video_batch().items() if k.endswith("videos") or k == "video_grid_thw"})
    error = refused(both, "video_grid_thw", "ordering videos among images for one encoder", mrope=False)
    assert "pass video_token_id=" in str(error)
    assert set(mimo_batch(both, mrope=False, video_modality="videos")["modality_inputs"]) == {"images", "videos"}  # apart: no order


def test_a_wrong_image_token_id_is_named():
    refused(one_image(), None, "no token of input_ids is 99: is image_token_id the tokenizer's image placeholder id?", image_token_id=99)


def test_placeholders_without_their_grid():
    batch = {k: v for k, v in one_image().items() if k not in ("image_grid_thw", "pixel_values")}
    refused(batch, None, "input_ids holds image placeholder tokens (image_token_id 5) but image_grid_thw is missing or empty")


def test_packed_micro_batches(real):
    packed = pack_microbatch(real, pad_multiple=8)
    assert mimo_batch(packed)["packing_kwargs"] is not None
    total = int(packed["cu_seqlens"][-1])
    refused({k: v for k, v in packed.items() if k != "cu_seqlens_unpadded"}, "cu_seqlens_unpadded", "is missing")
    refused({k: v for k, v in packed.items() if k != "max_seqlen"}, "max_seqlen", "is missing")
    refused(dict(packed, cu_seqlens=packed["cu_seqlens"].float()), "cu_seqlens", "must be an integer [sequences + 1] tensor")
    refused(dict(packed, cu_seqlens=packed["cu_seqlens"].flip(0)), "cu_seqlens", "must start at 0 and never decrease")
    refused(dict(packed, cu_seqlens_unpadded=packed["cu_seqlens_unpadded"][:-1]), "cu_seqlens_unpadded", "entries but cu_seqlens")
    refused(dict(packed, cu_seqlens_unpadded=packed["cu_seqlens"] * 2), "cu_seqlens_unpadded", "longer than its padded length")
    longer = packed["cu_seqlens"].clone()
    longer[-1] += 8
    refused(dict(packed, cu_seqlens=longer), "input_ids", f"must be one row of {total + 8} tokens in a packed micro-batch")
    two_rows = {k: (v.expand(2, *v.shape[1:]) if k in ("input_ids", "labels", "loss_mask", "position_ids") else v) for k, v in packed.items()}
    refused(two_rows, "input_ids", f"got shape (2, {total})")
    refused(dict(packed, max_seqlen=float(packed["max_seqlen"])), "max_seqlen", "must be an integer")
    refused(dict(packed, max_seqlen=1), "max_seqlen", "at least the longest padded sequence")
    assert mimo_batch(dict(packed, max_seqlen=torch.tensor(packed["max_seqlen"])))["packing_kwargs"] is not None


def test_a_micro_batch_without_a_step_is_named_with_a_question_mark():
    batch = {k: v for k, v in one_image(rows=44).items() if k != "step"}
    refused(batch, "image_grid_thw", "describes 48 patches")


@settings(max_examples=40, deadline=None)
@given(grids=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4),
       extra=st.integers(-5, 5))
def test_rows_are_accepted_exactly_when_they_add_up(grids, extra):
    grids = [[t, 2 * h, 2 * w] for t, h, w in grids]
    described = sum(int(np.prod(g)) for g in grids)
    batch = {"pixel_values": torch.zeros(max(described + extra, 0), 4), "image_grid_thw": torch.tensor(grids), "step": 1}
    if described + extra == described:
        assert mimo_batch(batch, mrope=False)["modality_inputs"]["images"]["qwen_visual"]["grid_thw"] is batch["image_grid_thw"]
    else:
        refused(batch, "image_grid_thw", f"describes {described} patches", mrope=False)


def test_an_empty_micro_batch_is_refused():
    refused({}, None, "holds none of the fields mimo_batch reads")
    refused({"sample_ids": [1, 2], "step": 3}, None, "got ['sample_ids', 'step']")


@pytest.mark.parametrize("value", [3.5, -1.0, float("nan")], ids=repr)
def test_a_loss_mask_outside_0_to_1_is_refused(value):
    batch = one_image()
    batch["loss_mask"][0, 1] = value
    refused(batch, "loss_mask", "loss_mask must hold weights from 0 (not trained) to 1, got")


def test_a_bool_or_integer_loss_mask_comes_out_as_float_weights():
    for dtype in (torch.bool, torch.int64):
        batch = one_image()
        batch["loss_mask"] = batch["loss_mask"].to(dtype)
        out = mimo_batch(batch)["loss_mask"]
        assert out.dtype == torch.float32 and torch.equal(out, batch["attention_mask"].float())
    batch = one_image()
    assert mimo_batch(batch)["loss_mask"] is batch["loss_mask"]  # float weights pass as they are


@pytest.mark.parametrize(("option", "value", "words"), [
    ("image_token_id", "5", "image_token_id: must be an integer >= 0, got '5' (a str)"),
    ("image_token_id", 5.0, "image_token_id: must be an integer >= 0, got 5.0 (a float)"),
    ("video_token_id", True, "video_token_id: must be an integer >= 0, got True (a bool)"),
    ("spatial_merge_size", 0, "spatial_merge_size: must be an integer >= 1, got 0"),
    ("tokens_per_second", "2", "tokens_per_second must be a positive number, got '2'"),
    ("mrope", "yes", "mrope must be True or False, got 'yes'"),
])
def test_a_setting_of_the_wrong_kind_is_refused_where_it_is_given(option, value, words):
    """A string id used to be taken, to match no token and blame the tokenizer later."""
    with pytest.raises(ValueError) as caught:
        mimo_batch(one_image(), **{option: value})
    message = str(caught.value)
    assert message.startswith("mimo_batch: ") and words in message and "\n" not in message, message
    assert mimo_batch(one_image(), image_token_id=np.int64(IMAGE))["input_ids"] is not None  # numpy ids are ids
