"""The GPU benchmark's CPU smoke mode: the script runs end to end on the library's loaders, so it cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
            assert sum(len(ids) for ids in step["sample_ids"]) == 4
        assert result["slowest_sum_ms"] >= result["mean_sum_ms"] > 0
    off, on = results["off"]["steps"], results["on, window 1"]["steps"]
    for before, after in zip(off, on, strict=True):
        # The same global micro-batch, balanced: the heaviest rank never carries more image tokens (B = 4: exact search).
        assert sorted(sum(before["sample_ids"], [])) == sorted(sum(after["sample_ids"], []))
        assert max(after["image_tokens"]) <= max(before["image_tokens"])
    assert "| dp | micro-batch | mode |" in (tmp_path / "encoder_step.md").read_text()
