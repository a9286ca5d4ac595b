"""The pixel table (data/processing/fast_pixels.py) gives the image processor's own pixel values, bit for bit,
and steps aside wherever it cannot: other image modes, processors that do not work as it assumes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.conversation import row_images
from mimo_pipes.data.processing.fast_pixels import PixelTable, preprocess_options, probe
from mimo_pipes.data.processing.media import open_image
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.saved_folder import open_dataset


@pytest.fixture(scope="module")
def family():
    return load_processor(default_processor_path(), 2048).family


def processors_own(family, images: list) -> tuple[np.ndarray, np.ndarray]:
    feats = family.image_processor(images=images, return_tensors="np")
    return np.asarray(feats["pixel_values"]), np.asarray(feats["image_grid_thw"])


def assert_same(family, images: list) -> None:
    pixels, grid = family.pixel_table.pixels(images)
    expected_pixels, expected_grid = processors_own(family, images)
    assert pixels.dtype == expected_pixels.dtype == np.float32
    assert pixels.shape == expected_pixels.shape and np.array_equal(grid, expected_grid)
    assert np.array_equal(pixels, expected_pixels)  # bit for bit: every value the processor's own


def test_the_embedded_processor_takes_the_table(family):
    assert isinstance(family.pixel_table, PixelTable)


class _Before518:
    """The embedded image processor as transformers 5.17 has it: no ``_merge_and_standardize_kwargs``."""

    def __init__(self, image_processor) -> None:
        self._wrapped = image_processor

    def __call__(self, *args, **kwargs):
        return self._wrapped(*args, **kwargs)

    def __getattr__(self, name: str):
        if name == "_merge_and_standardize_kwargs":
            raise AttributeError(name)
        return getattr(self._wrapped, name)


def test_the_options_read_without_the_newer_helper_are_the_same(family):
    """transformers before 5.18 fills in and standardizes the options inside ``preprocess``; the table reads them
    from the same two pieces there, and gets what the newer helper gives (and a table that passes the probe)."""
    newer, older = preprocess_options(family.image_processor), preprocess_options(_Before518(family.image_processor))
    assert older == newer and older["size"].shortest_edge > 0
    table = probe(_Before518(family.image_processor))
    assert isinstance(table, PixelTable) and np.array_equal(table.table, family.pixel_table.table)


def test_embedded_samples_get_the_processors_pixels(family):
    processor = load_processor(default_processor_path(), 2048)
    dataset = open_dataset(default_dataset_path())
    checked = 0
    # Rows 0-28: every kind with images (receipts and documents in grayscale, thumbnails, photos, charts, rows of
    # two and of three images), 24 rows in all; rows 29-39 hold more of the same kinds.
    for index in range(29):
        images = [open_image(item, processor.image_folder, index, f"image {k}") for k, item in enumerate(row_images(dataset[index]))]
        if images:
            assert_same(family, images)
            checked += 1
    assert checked >= 20


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 400)), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_any_rgb_images_get_the_processors_pixels(family, sizes, seed):
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB") for height, width in sizes]
    try:
        processors_own(family, images)
    except ValueError as refused:  # an aspect ratio past the processor's limit: refused the same way
        with pytest.raises(ValueError, match=str(refused)):
            family.pixel_table.pixels(images)
        return
    assert_same(family, images)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16", "CMYK", "RGB with a transparent colour"])
def test_other_modes_take_the_processors_own_path(family, mode):
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 256, (60, 90, 3), dtype=np.uint8), "RGB")
    if mode == "I;16":
        image = Image.fromarray(np.full((60, 90), 40000, dtype=np.uint16))
    elif mode.startswith("RGB with"):
        image = rgb.copy()
        image.info["transparency"] = tuple(int(v) for v in np.asarray(rgb)[0, 0])  # composited onto white by the processor
    else:
        image = rgb.convert(mode)
    assert not family.pixel_table.handles([rgb, image])
    fields, _ = family.images([rgb, image], sample=7)
    expected_pixels, expected_grid = processors_own(family, [rgb, image])
    assert np.array_equal(fields["pixel_values"], expected_pixels) and np.array_equal(fields["image_grid_thw"], expected_grid)


def test_a_processor_that_lays_patches_out_otherwise_keeps_its_own_path(family):
    processor = load_processor(default_processor_path(), 2048).family.image_processor
    own = processor.patchify

    def reversed_rows(image, **kwargs):
        patches, grid_h, grid_w = own(image, **kwargs)
        return patches[::-1], grid_h, grid_w

    processor.patchify = reversed_rows
    assert probe(processor) is None


def test_a_processor_that_normalizes_otherwise_keeps_its_own_path(family):
    processor = load_processor(default_processor_path(), 2048).family.image_processor
    processor.image_std = [s * 2 for s in processor.image_std]
    table = probe(processor)
    assert table is not None  # its own normalize, with its own settings: still the table's values
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (80, 120, 3), dtype=np.uint8), "RGB")
    pixels, _ = table.pixels([image])
    assert np.array_equal(pixels, processor(images=[image], return_tensors="np")["pixel_values"])
    assert not np.array_equal(pixels, family.pixel_table.pixels([image])[0])


def test_the_benchmark_checks_both_paths_alike(capsys):
    import runpy
    from pathlib import Path

    main = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "pixel_table.py"))["main"]
    # 3 rows: two with an image, one without (the embedded data's first rows); each path runs on every one
    assert main(["--rows", "3", "--rounds", "1", "--no-docs"]) == 0
    assert "identical fields: True" in capsys.readouterr().out


def _camera_jpeg(height: int, width: int, seed: int, orientation: int | None = None) -> bytes:
    """A smooth scene with grain, as a camera JPEG (``orientation``: its EXIF Orientation tag)."""
    import io

    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (height // 64 + 2, width // 64 + 2, 3), dtype=np.uint8))
    # Kept 6 away from either end, the grain adds in place in uint8 (a negative step wraps round to a subtraction):
    # half the passes over a 12 MP image that int16 arithmetic and a clip take.
    scene = np.clip(np.asarray(coarse.resize((width, height), Image.BICUBIC)), 6, 249)
    scene += rng.integers(-6, 7, (height, width, 1), dtype=np.int8).view(np.uint8)
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.fromarray(scene).save(buffer, format="JPEG", quality=85, exif=exif.tobytes())
    return buffer.getvalue()


@pytest.mark.parametrize(("height", "width", "orientation"), [(3000, 4000, None), (3508, 2480, None), (2000, 3000, 6), (1200, 900, 3)])
def test_large_photos_and_scans_get_the_processors_pixels(family, height, width, orientation):
    """12 MP photos and A4 pages at 300 dpi, resized down past the largest pixel count (the resize the table
    makes on the decoded image, to the rule's size) and turned by their EXIF orientation: the processor's values, bit for bit,
    from the image decoded as transformers' load_image decodes it."""
    import io

    from PIL import ImageOps

    data = _camera_jpeg(height, width, height + width, orientation)
    image = open_image({"bytes": data, "path": None}, None, 0, "image 0")
    with Image.open(io.BytesIO(data)) as reference:
        expected = ImageOps.exif_transpose(reference).convert("RGB")  # transformers' load_image, step for step
    assert image.size == expected.size and image.mode == "RGB" and np.array_equal(np.asarray(image), np.asarray(expected))
    # Two images of a row, one small: the table lays each image out on its own (PixelTable.pixels), so the large
    # one's values are checked bit for bit here as alone, without running the processor on it twice.
    assert_same(family, [image, expected.resize((width // 5, height // 7))])
