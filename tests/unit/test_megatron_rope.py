"""M-RoPE positions equal transformers' own ``get_rope_index`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) on real processor
outputs and on random layouts, padded and packed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron_inputs import END, IMAGE, MERGE, ROWS, START, VIDEO, microbatch, reference, truncates_video_seconds

from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.megatron.rope import mrope_position_ids, vision_items
from mimo_pipes.samples.thd import pack_microbatch


def ours(family: str, input_ids, *, tokens_per_second=2.0, seconds=1.0, **kwargs):
    interval = tokens_per_second * seconds if family == "qwen2.5-vl" else 1.0
    return mrope_position_ids(input_ids, image_token_id=IMAGE, video_token_id=VIDEO, spatial_merge_size=MERGE,
                              video_intervals=interval, split_video_frames=family == "qwen3-vl", **kwargs)


@pytest.fixture(scope="module")
def processor():
    return load_processor(default_processor_path(), 1024)


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_one_sample_of_the_processor_equals_transformers(processor, name, family):
    batch = microbatch(processor, [name])
    expected = reference(family, batch["input_ids"], image_grid_thw=batch["image_grid_thw"] if batch["image_grid_thw"].numel() else None)
    assert torch.equal(ours(family, batch["input_ids"], image_grid_thw=batch["image_grid_thw"]), expected)


def test_a_padded_batch_equals_transformers_with_its_attention_mask(processor):
    batch = microbatch(processor, ["one image", "text only", "several images", "one wide image"], pad_length=200)
    assert bool((batch["attention_mask"] == 0).any())  # rows of different lengths: padding on the right
    expected = reference("qwen2-vl", batch["input_ids"], image_grid_thw=batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    got = ours("qwen2-vl", batch["input_ids"], image_grid_thw=batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    assert torch.equal(got, expected)
    assert bool((got[:, batch["attention_mask"] == 0] == 0).all())


@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_a_packed_batch_restarts_at_every_sequence(processor, pad_multiple):
    names = ["several images", "text only", "one image", "one wide image"]
    batch = microbatch(processor, names, pad_length=200)
    packed = pack_microbatch(batch, pad_multiple=pad_multiple)
    got = ours("qwen2-vl", packed["input_ids"], image_grid_thw=packed["image_grid_thw"], cu_seqlens=packed["cu_seqlens"],
               cu_seqlens_unpadded=packed["cu_seqlens_unpadded"])
    assert got.shape == (3, 1, packed["input_ids"].shape[1])
    starts, real = packed["cu_seqlens"].tolist(), packed["cu_seqlens_unpadded"].tolist()
    image_at = 0
    for k, name in enumerate(names):
        alone = microbatch(processor, [name])
        images = alone["image_grid_thw"].shape[0]
        assert torch.equal(alone["image_grid_thw"], packed["image_grid_thw"][image_at : image_at + images])
        image_at += images
        expected = reference("qwen2-vl", alone["input_ids"], image_grid_thw=alone["image_grid_thw"] if images else None)[:, 0]
        length = real[k + 1] - real[k]
        assert torch.equal(got[:, 0, starts[k] : starts[k] + length], expected)
        assert bool((got[:, 0, starts[k] + length : starts[k + 1]] == 0).all())  # the sequence's padding


def video_sequence(family: str, grids: list[list[int]], images: list[list[int]], text: int = 3) -> torch.Tensor:
    """A hand-built sequence: text, images, then videos, laid out as the family's processor lays them out
    (Qwen3-VL: one block per frame, a timestamp's text between frames)."""
    ids: list[int] = [10 + k for k in range(text)]
    for t, h, w in images:
        ids += [START] + [IMAGE] * (t * h * w // MERGE**2) + [END, 20]
    for t, h, w in grids:
        if family == "qwen3-vl":
            for frame in range(t):
                ids += [30 + frame, START] + [VIDEO] * (h * w // MERGE**2) + [END]
        else:
            ids += [START] + [VIDEO] * (t * h * w // MERGE**2) + [END]
        ids += [40, 41]
    return torch.tensor([ids])


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_videos_equal_transformers(family):
    if family == "qwen2.5-vl" and truncates_video_seconds():
        pytest.skip("transformers < 5.18 truncates seconds per video grid: the reference is 5.18's and later")
    videos, images = [[3, 4, 6], [1, 2, 2], [5, 8, 4]], [[1, 6, 4]]
    ids = video_sequence(family, videos, images)
    video_grid, image_grid = torch.tensor(videos), torch.tensor(images)
    seconds = torch.tensor([0.5, 1.0, 2.0])
    expected = reference(family, ids, image_grid_thw=image_grid, video_grid_thw=video_grid, tokens_per_second=2.0, seconds=seconds)
    if family == "qwen2.5-vl":  # one interval per video
        got = mrope_position_ids(ids, image_token_id=IMAGE, video_token_id=VIDEO, image_grid_thw=image_grid, video_grid_thw=video_grid,
                                 spatial_merge_size=MERGE, video_intervals=(2.0 * seconds).tolist())
    else:
        got = ours(family, ids, image_grid_thw=image_grid, video_grid_thw=video_grid)
    assert torch.equal(got, expected)


def test_placeholders_that_do_not_match_the_grids_are_refused():
    ids = video_sequence("qwen2-vl", [], [[1, 4, 4]])
    with pytest.raises(ValueError, match="image_grid_thw describes 2 items but the image placeholder tokens of input_ids .image_token_id 5. fill 1"):
        mrope_position_ids(ids, image_token_id=IMAGE, image_grid_thw=torch.tensor([[1, 4, 4], [1, 2, 2]]))
    with pytest.raises(ValueError, match="input_ids holds image placeholder tokens .image_token_id 5. but image_grid_thw is missing"):
        mrope_position_ids(ids, image_token_id=IMAGE, image_grid_thw=None)
    with pytest.raises(ValueError, match="ends inside an item"):
        mrope_position_ids(ids, image_token_id=IMAGE, image_grid_thw=torch.tensor([[1, 4, 8]]))


# ---- random layouts: the same equality, and the restart per sequence, on many shapes

grid_side = st.integers(1, 4).map(lambda n: n * MERGE)
image_grid = st.tuples(st.just(1), grid_side, grid_side).map(list)
layout = st.lists(st.one_of(st.integers(1, 6), image_grid), min_size=1, max_size=6)


def build(parts) -> tuple[list[int], list[list[int]]]:
    ids, grids = [], []
    for part in parts:
        if isinstance(part, int):
            ids += [100 + k for k in range(part)]
        else:
            ids += [START] + [IMAGE] * (part[1] * part[2] // MERGE**2) + [END]
            grids.append(part)
    return ids, grids


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(layout, min_size=1, max_size=4), family=st.sampled_from(["qwen2-vl", "qwen2.5-vl", "qwen3-vl"]))
def test_random_padded_batches_equal_transformers(rows, family):
    built = [build(parts) for parts in rows]
    length = max(len(ids) for ids, _ in built) + 2
    input_ids = torch.zeros((len(built), length), dtype=torch.int64)
    mask = torch.zeros_like(input_ids)
    for row, (ids, _) in enumerate(built):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    grids = [g for _, row_grids in built for g in row_grids]
    grid = torch.tensor(grids).reshape(-1, 3) if grids else None
    expected = reference(family, input_ids, image_grid_thw=grid, attention_mask=mask)
    assert torch.equal(ours(family, input_ids, image_grid_thw=grid, attention_mask=mask), expected)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(layout, min_size=1, max_size=4), pad=st.lists(st.integers(0, 3), min_size=4, max_size=4))
def test_a_packed_row_is_its_sequences_each_from_zero(rows, pad):
    built = [build(parts) for parts in rows]
    pieces, starts, real = [], [0], [0]
    for k, (ids, _) in enumerate(built):
        pieces.append(torch.tensor(ids + [0] * pad[k]))
        starts.append(starts[-1] + len(ids) + pad[k])
        real.append(real[-1] + len(ids))
    grids = [g for _, row_grids in built for g in row_grids]
    grid = torch.tensor(grids).reshape(-1, 3) if grids else None
    packed = mrope_position_ids(torch.cat(pieces)[None], image_token_id=IMAGE, image_grid_thw=grid,
                                cu_seqlens=torch.tensor(starts), cu_seqlens_unpadded=torch.tensor(real))
    at = 0
    for k, (ids, row_grids) in enumerate(built):
        alone = mrope_position_ids(torch.tensor([ids]), image_token_id=IMAGE, image_grid_thw=torch.tensor(row_grids).reshape(-1, 3))
        assert torch.equal(packed[:, 0, starts[k] : starts[k] + len(ids)], alone[:, 0])
        assert bool((packed[:, 0, starts[k] + len(ids) : starts[k + 1]] == 0).all())
        at += len(row_grids)


@settings(max_examples=100, deadline=None)
@given(parts=layout)
def test_each_image_covers_its_grid_and_text_continues_past_it(parts):
    ids, grids = build(parts)
    positions = mrope_position_ids(torch.tensor([ids]), image_token_id=IMAGE, image_grid_thw=torch.tensor(grids).reshape(-1, 3))[:, 0]
    at, current, image = 0, 0, 0
    for part in parts:
        if isinstance(part, int):
            assert positions[:, at : at + part].tolist() == [list(range(current, current + part))] * 3
            at, current = at + part, current + part
            continue
        at, current = at + 1, current + 1  # <|vision_start|> is text
        h, w = part[1] // MERGE, part[2] // MERGE
        block = positions[:, at : at + h * w] - current
        assert sorted(map(tuple, block.T.tolist())) == [(0, i, j) for i in range(h) for j in range(w)]
        at, current, image = at + h * w, current + max(h, w), image + 1
        assert positions[:, at].tolist() == [current] * 3  # <|vision_end|>
        at, current = at + 1, current + 1


@given(grids=st.lists(st.tuples(st.integers(1, 4), grid_side, grid_side), max_size=5), split=st.booleans())
def test_vision_items_split_frames_keep_every_token(grids, split):
    grid = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
    items = vision_items(grid, MERGE, split_frames=split)
    assert sum(item.tokens for item in items) == sum(t * h * w // MERGE**2 for t, h, w in grids)
    assert len(items) == (sum(t for t, _, _ in grids) if split else len(grids))
