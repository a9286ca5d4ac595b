"""Images and videos from the data: paths stay inside the image folder, and pixels are what transformers
gives (its ``load_image``, then the family's own image processor) for every orientation and mode."""

from __future__ import annotations

import io
import os

import datasets
import numpy as np
import PIL.Image
import pytest
from PIL import Image
from transformers import AutoImageProcessor
from transformers.image_utils import load_image

from mimo_pipes.analysis.row_counts import count_rows
from mimo_pipes.data.bad_rows.skipping import REPLACED_ROWS, SkipBadRows
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.embedded.family_processors import build_family_processor
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.open_source import dataset_folder
from mimo_pipes.errors import SampleError
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP

CHAT = [{"role": "user", "content": "what is it?"}, {"role": "assistant", "content": "a picture"}]


def _row(images, sample_id=3, **extra):
    return {SAMPLE_ID: sample_id, "images": images, "messages": CHAT, **extra}


@pytest.fixture()
def folders(tmp_path):
    """(image folder, a folder beside it) with a valid PNG in each."""
    inside, outside = tmp_path / "images", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    picture = Image.fromarray(np.full((40, 60, 3), 90, dtype=np.uint8))
    picture.save(inside / "in.png")
    picture.save(outside / "secret.png")
    (inside / "sub").mkdir()
    os.symlink(inside / "in.png", inside / "sub" / "link-in.png")
    os.symlink(outside / "secret.png", inside / "link-out.png")
    os.symlink(outside, inside / "dir-out")
    return inside, outside


@pytest.fixture()
def opened(monkeypatch):
    """Every path PIL is asked to open."""
    paths: list[str] = []
    real_open = PIL.Image.open

    def spy(source, *args, **kwargs):
        if isinstance(source, (str, os.PathLike)):
            paths.append(os.path.realpath(source))
        return real_open(source, *args, **kwargs)

    monkeypatch.setattr(PIL.Image, "open", spy)
    return paths


# ----------------------------------------------------------------------------------------------------
# Containment


def _escapes(inside, outside):
    return {
        "dot-dot": "../elsewhere/secret.png",
        "absolute": str(outside / "secret.png"),
        "symlink to a file": "link-out.png",
        "symlink to a folder": "dir-out/secret.png",
        "dot-dot inside a dict": {"bytes": None, "path": "../elsewhere/secret.png"},
    }


def test_paths_outside_the_image_folder_are_bad_rows_never_opened(folders, opened):
    inside, outside = folders
    processor = load_processor(default_processor_path(), 512, image_folder=str(inside))
    for name, path in _escapes(inside, outside).items():
        with pytest.raises(SampleError, match="dataset row 3: image 0 .* is outside the image folder") as info:
            processor(_row([path]))
        assert info.value.sample_id == 3 and info.value.field == "images", name
        assert str(outside) not in str(info.value).replace(str(path), ""), name  # no resolved path printed
    assert str(outside / "secret.png") not in opened


def test_video_frames_outside_the_image_folder_are_refused(folders, tmp_path):
    inside, _ = folders
    processor = load_processor(build_family_processor(tmp_path / "qwen", "qwen2-vl"), 2048, image_folder=str(inside))
    row = {SAMPLE_ID: 4, "videos": [["in.png", "../elsewhere/secret.png"]],
           "messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "and?"}]},
                        {"role": "assistant", "content": "ok"}]}
    with pytest.raises(SampleError, match="dataset row 4: video 0 frame 1 .* is outside the image folder"):
        processor(row)


def test_paths_inside_the_image_folder_are_read(folders):
    inside, _ = folders
    processor = load_processor(default_processor_path(), 512, image_folder=str(inside))
    expected = processor(_row(["in.png"]))["pixel_values"]
    for path in (str(inside / "in.png"), "sub/link-in.png", "sub/../in.png", {"bytes": None, "path": "in.png"}):
        assert processor(_row([path]))["pixel_values"].equal(expected)


def test_a_path_without_an_image_folder_is_a_bad_row(folders):
    inside, _ = folders
    processor = load_processor(default_processor_path(), 512)
    with pytest.raises(SampleError, match="dataset row 3: image 0 .* is a path, but no image folder is set"):
        processor(_row([str(inside / "in.png")]))


def test_skip_bad_samples_skips_a_path_outside_the_folder(folders):
    inside, _ = folders
    processor = load_processor(default_processor_path(), 512, image_folder=str(inside))
    rows = [_row(["../elsewhere/secret.png" if i == 1 else "in.png"], sample_id=i) for i in range(4)]
    skip = SkipBadRows(processor, rows, micro_batch_size=4, seed=0, dataloader_type="single")
    sample = skip({**rows[1], STEP: 0, SLOT: 0})
    assert sample[SAMPLE_ID] == 2 and sample[REPLACED_ROWS] == [1]


def test_analyze_counts_never_open_a_path_outside_the_folder(folders, opened):
    inside, outside = folders
    processor = load_processor(default_processor_path(), 512, image_folder=str(inside))
    features = datasets.Features({"images": datasets.List(datasets.Image(decode=False)),
                                  "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})})
    rows = {"images": [[{"bytes": None, "path": "in.png"}], [{"bytes": None, "path": "../elsewhere/secret.png"}]], "messages": [CHAT, CHAT]}
    dataset = datasets.Dataset.from_dict(rows, features=features)
    with pytest.raises(SampleError, match="dataset row 1: image 0 .* is outside the image folder"):
        count_rows(dataset, processor, use_cache=False)
    assert str(outside / "secret.png") not in opened


def test_the_dataset_folder_holds_the_images_when_no_image_folder_is_given(tmp_path):
    (tmp_path / "data" / "parts").mkdir(parents=True)
    (tmp_path / "data" / "rows.jsonl").write_text("{}\n")
    assert dataset_folder(str(tmp_path / "data" / "rows.jsonl")) == tmp_path / "data"
    assert dataset_folder(str(tmp_path / "data" / "parts" / "part-*.parquet")) == tmp_path / "data" / "parts"
    assert dataset_folder(str(tmp_path / "data" / "*" / "x.parquet")) == tmp_path / "data"
    assert dataset_folder(str(tmp_path / "data")) == tmp_path / "data"


# ----------------------------------------------------------------------------------------------------
# Orientation and modes, as transformers gives them


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _mode_table() -> dict[str, bytes]:
    """Small images of every orientation and mode that real data holds, encoded as files hold them."""
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (44, 66, 3), dtype=np.uint8)
    table = {}
    for orientation in (3, 6, 8):  # rotated 180, 90 clockwise (a portrait phone photo), 90 counter-clockwise
        picture = Image.fromarray(rgb)
        exif = picture.getexif()
        exif[0x0112] = orientation
        table[f"exif orientation {orientation}"] = _encoded(picture, "JPEG", exif=exif, quality=95)
    table["CMYK JPEG"] = _encoded(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95)
    table["16-bit PNG (I;16)"] = _encoded(Image.fromarray(rng.integers(0, 400, (44, 66)).astype(np.uint16)), "PNG")
    table["grayscale L"] = _encoded(Image.fromarray(rgb[..., 0]), "PNG")
    table["grayscale LA"] = _encoded(Image.merge("LA", [Image.fromarray(rgb[..., 0]), Image.fromarray(rgb[..., 1])]), "PNG")
    table["palette P with transparency"] = _encoded(Image.fromarray(rgb).convert("P"), "PNG", transparency=3)
    table["RGBA with alpha"] = _encoded(Image.fromarray(np.dstack([rgb, rng.integers(0, 256, (44, 66), dtype=np.uint8)])), "PNG")
    frames = [Image.fromarray(rng.integers(0, 256, (44, 66, 3), dtype=np.uint8)) for _ in range(3)]
    table["animated GIF"] = _encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    table["animated WebP"] = _encoded(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    return table


MODES = _mode_table()


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: build_family_processor(root / family, family) for family in ("qwen2-vl", "qwen3-vl", "internvl")}


def test_the_table_holds_what_it_says():
    modes = {name: Image.open(io.BytesIO(data)) for name, data in MODES.items()}
    assert modes["CMYK JPEG"].mode == "CMYK" and modes["16-bit PNG (I;16)"].mode == "I;16"
    assert modes["grayscale LA"].mode == "LA" and modes["RGBA with alpha"].mode == "RGBA"
    assert modes["palette P with transparency"].mode == "P" and "transparency" in modes["palette P with transparency"].info
    assert modes["animated GIF"].n_frames == 3 and modes["animated WebP"].n_frames == 3
    assert modes["exif orientation 6"].getexif()[0x0112] == 6


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen3-vl", "internvl"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_pixels_are_what_transformers_gives(family_folders, family, mode, tmp_path):
    folder = family_folders[family]
    ours = load_processor(folder, 4096, image_folder=str(tmp_path))
    theirs = AutoImageProcessor.from_pretrained(str(folder), backend="pil")  # the backend load_processor asks for
    data = MODES[mode]
    expected = theirs(images=[load_image(Image.open(io.BytesIO(data)))], return_tensors="np")
    (tmp_path / "file").write_bytes(data)
    for form in ({"bytes": data, "path": None}, data, "file", Image.open(io.BytesIO(data))):
        out = ours(_row([form]))
        np.testing.assert_array_equal(out["pixel_values"].numpy(), expected["pixel_values"], err_msg=f"{mode} as {type(form).__name__}")
        if "image_grid_thw" in expected:
            assert out["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
        else:
            assert out["image_num_tiles"].tolist() == list(expected["num_patches"])


def test_a_portrait_phone_photo_is_processed_portrait(family_folders):
    processor = load_processor(family_folders["qwen2-vl"], 4096)
    photo = Image.fromarray(np.zeros((168, 280, 3), dtype=np.uint8))  # stored landscape, 280 wide
    exif = photo.getexif()
    exif[0x0112] = 6  # shown turned a quarter clockwise: portrait
    grid = processor(_row([{"bytes": _encoded(photo, "JPEG", exif=exif), "path": None}]))["image_grid_thw"]
    assert grid.tolist() == [[1, 280 // 14, 168 // 14]]
