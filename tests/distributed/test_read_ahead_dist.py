"""Read-ahead on every entry point over real Gloo groups: with the loader reading ahead, take N micro-batches, save,
restore into a fresh loader: the next is micro-batch N; the stream with read-ahead on is the one with it off; no
read-ahead thread is left after close. Layouts: DP 1; language dp 2 with images dp 1; windows of 2 whose samples
move across micro-batches (saved inside a window)."""

from __future__ import annotations

import pytest
from scenarios_read_ahead import ENTRY_POINTS, read_ahead_resume

from mimo_pipes.parallel.topology import build_topology

LAYOUTS = {
    "dp1": dict(components=["language=dp=1"], micro_batch_size=4, point=3),
    "language-dp2-images-dp1": dict(components=["language=dp=2", "images=dp=1,rank_offset=2"], micro_batch_size=4, point=3),
    "window-2-across": dict(components=["language=dp=2", "images=dp=1,rank_offset=2"], micro_batch_size=4, point=3, window_size=2,
                            across=True),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_state_saved_while_reading_ahead_restores_at_the_next_micro_batch(gloo_pool, tmp_path, entry, layout):
    settings = LAYOUTS[layout]
    outcomes = [o for o in gloo_pool.run(read_ahead_resume, entry=entry, steps=7, seed=5, directory=str(tmp_path), **settings,
                                         timeout=300) if o]
    assert len(outcomes) == build_topology(settings["components"]).world_size
    for outcome in outcomes:
        where = f"{entry}, {outcome['module']} dp rank {outcome['dp_rank']}"
        assert outcome["same_stream"], f"{where}: read-ahead on and off give different streams"
        assert outcome["next_step"] == outcome["expected_step"], f"{where}: restored at step {outcome['next_step']}"
        assert outcome["resumed"], f"{where}: the restored stream differs"
        assert outcome["threads_left"] == 0, f"{where}: {outcome['threads_left']} read-ahead threads left"
