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
