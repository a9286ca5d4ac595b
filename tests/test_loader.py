"""GraphLoader.close(): every graph thread stops (torchdata's mapper workers too), and iterating again
resumes exactly where the loader stood."""

from __future__ import annotations

import threading

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def tag(sample: dict) -> dict:
    sample["tagged"] = True
    return sample


def graph():
    config = PipelineConfig(
        components=("language=dp=1",),
        micro_batch_size=4,
        num_workers=2,
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=3),
    )
    return pipeline(SyntheticProcessedDataset(64), config, RankLayout(0, 1, 1), map_fn=tag,
                       image_token_id=IMAGE_TOKEN_ID, pad_values={})


def worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t is not threading.main_thread()]


def test_close_stops_mapper_threads_and_iteration_resumes_in_place():
    reference = graph()
    expected = [next(reference)["sample_ids"] for _ in range(8)]
    reference.close()
    before = set(worker_threads())
    loader = graph()
    got = [next(loader)["sample_ids"] for _ in range(4)]  # mid-window (W=3)
    assert set(worker_threads()) - before, "the mapper should be running on threads"
    loader.close()
    assert set(worker_threads()) <= before, f"threads left after close: {set(worker_threads()) - before}"
    got += [next(loader)["sample_ids"] for _ in range(4)]
    assert got == expected and loader.num_yielded == 8
    loader.close()
    loader.close()
    assert set(worker_threads()) <= before
