"""The GPU benchmark's CPU smoke mode: the script runs end to end on the library's loaders, so it cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.launch  # a benchmark script run end to end
def test_encoder_step_benchmark_smoke(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/encoder_step_gpu.py", "--device", "cpu", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "encoder_step.json").read_text())
    results = {r["mode"]: r for r in report["results"]}
    assert set(results) == {"off", "on, window 1", "on, window 4", "on, window 4, across"}
    for result in results.values():
        assert result["dp"] == 2 and result["steps_timed"] == 2
        for step in result["steps"]:
            assert len(step["rank_ms"]) == 2 and all(ms > 0 for ms in step["rank_ms"])
            assert sum(len(ids) for ids in step["sample_ids"]) == 2
        assert result["slowest_sum_ms"] >= result["mean_sum_ms"] > 0
    off, on = results["off"]["steps"], results["on, window 1"]["steps"]
    for before, after in zip(off, on, strict=True):
        # The same global micro-batch, balanced: the heaviest rank never carries more image tokens (exact search).
        assert sorted(sum(before["sample_ids"], [])) == sorted(sum(after["sample_ids"], []))
        assert max(after["image_tokens"]) <= max(before["image_tokens"])
    assert "| dp | micro-batch | mode |" in (tmp_path / "encoder_step.md").read_text()


def test_generated_rows_are_the_embedded_datasets_rows() -> None:
    """The benchmark generates rows instead of reading the saved dataset (no ``datasets`` on the GPU host)."""
    import io

    from PIL import Image

    from mimo_pipes.data.synthetic import generate_synthetic_dataset

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
