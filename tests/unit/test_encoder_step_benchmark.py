"""The GPU encoder-step benchmark generates the embedded dataset's rows (its smoke run is in tests/launch/test_benchmark_scripts.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_rows_are_the_embedded_datasets_rows() -> None:
    """The benchmark generates rows instead of reading the saved dataset (no ``datasets`` on the GPU host)."""
    import io

    from PIL import Image

    from mimo_pipes.data.embedded.synthetic import generate_synthetic_dataset

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from encoder_step_gpu import GeneratedRows

    saved, generated = generate_synthetic_dataset(None, 24, seed=0), GeneratedRows(24)
    assert len(generated) == len(saved) == 24
    for index in range(24):
        want, got = saved[index], generated[index]
        assert {k: got[k] for k in ("id", "prompt", "response", "kind")} == {k: want[k] for k in ("id", "prompt", "response", "kind")}
        got_images = [Image.open(io.BytesIO(image["bytes"])) for image in got["images"]]
        assert [im.size for im in got_images] == [im.size for im in want["images"]]
        assert [im.tobytes() for im in got_images] == [im.convert(got_im.mode).tobytes() for im, got_im in zip(want["images"], got_images)]


def _benchmark():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import encoder_step_gpu

    return encoder_step_gpu


def test_a_micro_batch_of_text_only_samples_travels_without_pixels() -> None:
    """Small data draws micro-batches with no image; the loader rank sends them (the tower skips them) instead of
    dying on the missing field and leaving the main process waiting."""
    import torch

    payload = _benchmark()._payload({"sample_ids": [3, 4], "image_tokens": [0, 0]}, bf16=False)
    assert payload == {"pixel_values": None, "image_grid_thw": None, "sample_ids": [3, 4], "image_tokens": [0, 0]}
    with_images = _benchmark()._payload({"pixel_values": torch.ones(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]]),
                                         "sample_ids": [5], "image_tokens": [1]}, bf16=True)
    assert with_images["pixel_values"].shape == (4, 6) and with_images["image_grid_thw"].tolist() == [[1, 2, 2]]


def test_a_loader_rank_that_fails_is_named_at_once() -> None:
    """A failed loader rank's report reaches the main process as an error naming it, not a wait until the timeout."""
    import queue

    import pytest

    batches: queue.Queue = queue.Queue()
    batches.put((0, 0, 0, {"sample_ids": [1]}))
    batches.put((0, -1, 1, "loader rank 1: KeyError: 'pixel_values'"))
    with pytest.raises(RuntimeError, match="loader rank 1: KeyError"):
        _benchmark()._collect(0, 0, 2, {}, batches)
