"""Rows counted from their text and image headers, and each module's fields of them, against the processor:
per family (images and, for the patch families, videos), the counts are the processed placeholder runs and
each module's fields are the processed ones, bit for bit, with the other module's fields dropped."""

from __future__ import annotations

import io
import pickle

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
from mimo_pipes.data.processing.row_layout import compact_layout, expanded
from mimo_pipes.errors import SampleError
from mimo_pipes.exchange.wire_format import decode_samples, encode_samples
from mimo_pipes.samples.cost import image_token_count, placeholder_runs
from mimo_pipes.samples.module_fields import ENCODER_TOKEN_FIELDS, LAYOUT_FIELDS, PIXEL_FIELDS, TOKEN_FIELDS, module_fields
from mimo_pipes.samples.sample import IMAGE_TOKENS, PLACEHOLDER_RUNS, REAL_TOKENS, TOKEN_LAYOUT

# (height, width): below the minimum area, at it, within, above the maximum (resized down), long and thin.
SIZES = [(20, 30), (56, 56), (100, 300), (300, 100), (700, 500), (33, 990), (57, 85)]


def encoded(height: int, width: int, seed: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, format=fmt)
    return buffer.getvalue()


def rows(folder, videos: bool) -> list[dict]:
    """Rows of every image kind the processor takes, several images, none; videos as arrays and frames."""
    (folder / "page.png").write_bytes(encoded(120, 90, 7, "PNG"))
    out = []
    for k, (height, width) in enumerate(SIZES):
        fmt, mode = ("PNG", "L") if k % 3 == 1 else ("JPEG", "RGB")
        out.append({"prompt": f"what is in picture {k}?", "response": f"{k} boxes", "images": [{"bytes": encoded(height, width, k, fmt, mode), "path": None}]})
    out.append({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "compare"}, {"type": "image"}]},
                             {"role": "assistant", "content": "the left one"}],
                "images": [encoded(64, 48, 20), {"bytes": None, "path": "page.png"}]})
    out.append({"prompt": "and this?", "response": "a photo", "image": "page.png"})
    out.append({"prompt": "a drawing", "response": "lines", "images": [Image.fromarray(np.full((70, 40, 3), 9, np.uint8))]})
    out.append({"prompt": "an array", "response": "noise", "images": [np.random.default_rng(3).integers(0, 255, (45, 66, 3), dtype=np.uint8)]})
    out.append({"prompt": "no picture here", "response": "only text"})
    # A portrait phone photo: stored landscape, turned by its EXIF orientation (decoding turns it too).
    exif = Image.Exif()
    exif[0x0112] = 6
    photo = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (300, 460, 3), dtype=np.uint8)).save(photo, format="JPEG", exif=exif)
    out.append({"prompt": "a portrait", "response": "a face", "images": [photo.getvalue()]})
    if videos:
        frames = np.random.default_rng(4).integers(0, 255, (3, 50, 70, 3), dtype=np.uint8)
        out.append({"prompt": "what happens?", "response": "it moves", "videos": [frames]})
        out.append({"prompt": "and here?", "response": "it stops", "images": [encoded(40, 40, 30)],
                    "videos": [[encoded(60, 90, 31), encoded(60, 90, 32)]]})
    return [dict(row, sample_id=index) for index, row in enumerate(out)]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    processor = load_processor(build_family_processor(root / "processor", request.param), 2048, image_folder=str(root))
    return request.param, processor, rows(root, videos=request.param != "internvl")


def assert_fields_equal(got: dict, want: dict, where: str) -> None:
    assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, f"{where}: {name}"
            assert torch.equal(got[name], value), f"{where}: {name} differs"
        else:
            assert got[name] == value, f"{where}: {name}"


def test_counts_are_the_processed_placeholder_runs(family):
    name, processor, data = family
    counter = RowCounter(processor)
    for row in data:
        processed = processor(dict(row))
        counted = counter.count(row)
        ids = processed["input_ids"]
        assert counted[IMAGE_TOKENS] == image_token_count(ids, processor.placeholder_ids), (name, row["sample_id"])
        assert counted[REAL_TOKENS] == int(processed["attention_mask"].sum())
        assert counted[PLACEHOLDER_RUNS] == placeholder_runs(ids, processor.placeholder_ids)
    assert counter.processed_for_cost == 0  # every size came from a header
    assert len({counter.count(row)[IMAGE_TOKENS] for row in data}) > 5  # the resize rule was exercised


def test_each_module_makes_the_processed_fields_it_carries(family):
    name, processor, data = family
    language, language_counter = ModuleProcessor(processor, module_fields("language")), RowCounter(processor, module_fields("language"))
    encoder, encoder_counter = ModuleProcessor(processor, module_fields("images")), RowCounter(processor, module_fields("images"))
    for row in data:
        processed = processor(dict(row))
        where = f"{name}, row {row['sample_id']}"
        got = language(language_counter.count(row))
        assert_fields_equal({k: v for k, v in got.items() if k not in (IMAGE_TOKENS, REAL_TOKENS)},
                            {k: v for k, v in processed.items() if k not in PIXEL_FIELDS}, where)
        got = encoder(encoder_counter.count(row))
        assert_fields_equal({k: v for k, v in got.items() if k not in (IMAGE_TOKENS, REAL_TOKENS)},
                            {k: v for k, v in processed.items() if k not in TOKEN_FIELDS or k in ENCODER_TOKEN_FIELDS}, where)
        assert TOKEN_LAYOUT not in got and PLACEHOLDER_RUNS not in got
        has_layout = any(field in processed for field in LAYOUT_FIELDS)
        assert has_layout == (processed.get("pixel_values") is not None or "pixel_values_videos" in processed)


def test_the_language_side_decodes_no_pixel(family, monkeypatch):
    _, processor, data = family
    language = ModuleProcessor(processor, module_fields("language"))
    counted = [RowCounter(processor, module_fields("language")).count(row) for row in data]
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("an image was decoded"))
    for row in counted + data[:-3]:  # counted rows carry their layout; plain ones are read from headers
        language(row)


def test_counted_rows_cross_the_wire_format_with_their_images_encoded(family):
    _, processor, data = family
    counted = [RowCounter(processor).count(row) for row in data]
    back = decode_samples(encode_samples(counted), len(counted), copy=True)
    language = ModuleProcessor(processor, module_fields("language"))
    for row, moved in zip(counted, back):
        images = moved.get("images") or ([moved["image"]] if "image" in moved else [])
        # encoded bytes (alone or with their path) or arrays: never a decoded image, never a bare path
        assert all(isinstance(item, (bytes, np.ndarray)) or (isinstance(item, dict) and item["bytes"]) for item in images)
        assert_fields_equal(language(moved), language(row), f"row {row['sample_id']}")


def test_each_module_moves_only_what_it_needs_of_a_row(family):
    _, processor, data = family
    language, encoder = RowCounter(processor, module_fields("language")), RowCounter(processor, module_fields("images"))
    for row in data:
        moved = language.count(row)
        assert not set(moved) & {"images", "image", "videos", "video", "prompt", "response", "messages"}  # layout only
        assert TOKEN_LAYOUT in moved and TOKEN_LAYOUT not in encoder.count(row)
        processed = processor(dict(row))
        placeholders = image_token_count(processed["input_ids"], processor.placeholder_ids)
        # one token per placeholder run: a text token's worth per image
        assert moved[TOKEN_LAYOUT]["input_ids"].shape[0] == processed["input_ids"].shape[0] - placeholders + len(moved[PLACEHOLDER_RUNS])
        assert moved[TOKEN_LAYOUT]["input_ids"].dtype == torch.int32


def test_rows_move_image_bytes_or_paths(family):
    _, processor, data = family
    by_path = next(row for row in data if row.get("image") == "page.png")
    loaded = RowCounter(processor, module_fields("images")).count(by_path)
    assert loaded["image"]["path"] == "page.png" and loaded["image"]["bytes"][:8] == b"\x89PNG\r\n\x1a\n"
    kept = RowCounter(processor, module_fields("images"), image_paths=True).count(by_path)
    assert kept["image"] == "page.png"
    assert torch.equal(ModuleProcessor(processor, module_fields("images"))(loaded)["pixel_values"], processor(dict(by_path))["pixel_values"])


def test_a_row_the_processor_refuses_raises_its_error(family):
    name, processor, data = family
    counter = RowCounter(processor)
    bad_rows = [{**data[0], "images": [{"bytes": None, "path": "missing.png"}]},  # a missing file
                {**data[7], "images": data[7]["images"][:1]},  # an image fewer than the chat names
                {"sample_id": 99, "prompt": "q"}]  # no reply to train on
    if name != "internvl":
        bad_rows.append({**data[0], "images": [encoded(2, 600, 1)]})  # an aspect ratio the resize rule refuses
    for bad in bad_rows:
        with pytest.raises(SampleError) as processing:
            processor(dict(bad))
        with pytest.raises(SampleError) as counting:
            counter.count(bad)
        assert str(counting.value) == str(processing.value)


def test_sizes_that_no_header_gives_are_processed_for_their_cost_and_counted(family, monkeypatch):
    name, processor, data = family
    rule = "get_number_of_image_patches" if name == "internvl" else "image_grid"
    target = processor.family.image_processor if name == "internvl" else processor.family
    monkeypatch.setattr(target, rule, lambda *args: (_ for _ in ()).throw(RuntimeError("no rule")), raising=False)
    language, counter = ModuleProcessor(processor, module_fields("language")), RowCounter(processor, module_fields("language"))
    with_images = [row for row in data if row.get("images") or row.get("image")]
    for row in with_images:
        processed = processor(dict(row))
        counted = counter.count(row)
        assert counted[IMAGE_TOKENS] == image_token_count(processed["input_ids"], processor.placeholder_ids)
        assert TOKEN_LAYOUT not in counted  # processed after the exchange too
        assert torch.equal(language(counted)["input_ids"], processed["input_ids"])
    assert counter.processed_for_cost == len(with_images)


def test_it_pickles_for_worker_processes(family):
    _, processor, data = family
    language, counter = ModuleProcessor(processor, module_fields("language")), RowCounter(processor, module_fields("language"))
    again, counted_again = pickle.loads(pickle.dumps(language)), pickle.loads(pickle.dumps(counter))
    assert torch.equal(again(counted_again.count(data[2]))["labels"], language(counter.count(data[2]))["labels"])


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.tuples(st.sampled_from([1, 2, 7, 8]), st.booleans()), max_size=60))
def test_a_compact_token_layout_stands_for_exactly_its_tokens(tokens):
    """Placeholder ids 7 and 8: every run of one of them is kept as one token and expanded back exactly,
    trained flags included (a run whose flags change is kept whole)."""
    ids, trained = [t for t, _ in tokens], [f for _, f in tokens]
    layout = compact_layout(ids, trained, {}, (7, 8))
    got_ids, got_trained = expanded(layout)
    assert got_ids.tolist() == ids and got_trained.tolist() == trained
    assert layout["input_ids"].dtype == torch.int32 and layout["input_ids"].shape[0] <= len(ids)
