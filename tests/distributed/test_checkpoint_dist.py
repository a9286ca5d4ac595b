"""Checkpoints over real Gloo ranks (the pool): the job's collective save when some ranks cannot write, and
ranks that restored positions of different saves refusing to go on (at start, and in the first exchange)."""

from __future__ import annotations

from scenarios_checkpoint import restore_mixed_positions, save_with_failing_ranks

LAYOUT = ["language=dp=2", "images=dp=2,rank_offset=2"]


def test_a_save_failing_on_two_of_four_ranks_keeps_the_previous_state_on_every_rank(gloo_pool, tmp_path):
    results = [r for r in gloo_pool.run(save_with_failing_ranks, LAYOUT, str(tmp_path), [1, 3]) if r is not None]
    assert len(results) == 4
    messages = {r["raised"] for r in results}
    assert len(messages) == 1  # every rank raises the same one line
    message = messages.pop()
    assert message.startswith("--save-state: the state after 6 micro-batches was not saved: rank 1 could not write "), message
    assert "no-such-folder" in message and f"{tmp_path} keeps the complete state saved after 3 micro-batches" in message
    for rank, result in enumerate(results):
        assert result["restored"] == {"num_yielded": 3, "rank": rank} and result["consumed"] == 3
        assert len(result["generations"]) == 1  # the failed generation's files are gone


def test_modules_restored_from_different_saves_refuse_at_start(gloo_pool):
    results = [r for r in gloo_pool.run(restore_mixed_positions, LAYOUT, mixed="modules") if r is not None]
    assert len(results) == 4
    expected = ("ranks restored different consumed micro-batches: ranks 0, 1 at micro-batch 5; ranks 2, 3 at micro-batch 3; their states "
                "come from different saves")
    assert all(r["raised"] is not None and r["raised"].startswith(expected) for r in results), results


def test_ranks_of_a_module_restored_from_different_saves_refuse_in_the_first_exchange(gloo_pool):
    results = [r for r in gloo_pool.run(restore_mixed_positions, LAYOUT, mixed="ranks") if r is not None]
    language = [r for r in results if r["module"] == "language"]
    assert [r["raised"] for r in results if r["module"] == "images"] == [None, None]
    assert len(language) == 2 and all(
        r["raised"].startswith("ranks restored different consumed micro-batches: rank 0 at micro-batch 5; rank 1 at micro-batch 3") for r in language)
