"""The GPU benchmark script's CPU smoke mode, and that it replays the run's data and planner."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import time_model_gpu  # noqa: E402 - benchmarks folder put on the path just above

from mimo_pipes.balance import balance_window  # noqa: E402


def test_rows_are_the_embedded_datasets():
    from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
    from mimo_pipes.data.sources.saved_folder import open_dataset

    dataset = open_dataset(default_dataset_path(16, seed=0))
    rows = time_model_gpu.embedded_rows(16)
    assert [r["id"] for r in rows] == list(dataset["id"])
    assert [r["prompt"] for r in rows] == list(dataset["prompt"])
    assert [len(r["images"]) for r in rows] == [len(images) for images in dataset["images"]]


def test_assignment_is_the_planners():
    costs = [[900, 0, 64, 4096, 256, 256, 1369, 0], [5, 6, 7, 8, 9, 10, 11, 12]]
    ranks = time_model_gpu.rank_assignments(costs, 2, 8, reorder=True, across=True, floor=100)
    assert ranks == [[sorted(s) for s in slots] for slots in balance_window(costs, 2, across_microbatches=True, floor=100)]
    assert time_model_gpu.rank_assignments(costs, 2, 8, reorder=False, across=False, floor=0) == [
        [[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]
    ]
