"""`mimo-pipes train` resumed on another layout (its per-rank body on the Gloo pool): the losses of every
iteration after the resume equal the uninterrupted run's within float summation tolerance, for language
dp 2 + vision dp 2 -> language dp 2 + vision dp 1, and language dp 2 + vision dp 1 -> language dp 4 +
vision dp 2; each iteration's global batch holds the same samples. The trainer's model and optimizer are
replicated over a module's DP ranks, so every rank of the new layout loads its module's first saved rank.

Tolerance as in test_train_dist.py: relative 1e-5, about 100 float32 ulps, far below what one lost,
repeated or mismatched sample of a global batch of 8 changes (1e-3 or more)."""

from __future__ import annotations

import math

from scenarios_train import train_jobs

A = ("language=dp=2", "images=dp=2,rank_offset=2")
B = ("language=dp=2", "images=dp=1,rank_offset=2")
C = ("language=dp=4", "images=dp=2,rank_offset=4")
RTOL = 1e-5


def language_losses(outcomes: list[dict | None]) -> list[float]:
    """The job's losses per iteration (every language rank holds the global batch's loss)."""
    language = [o for o in outcomes if o is not None and o["module"] == "language"]
    assert language and all(o["losses"] == language[0]["losses"] for o in language)
    return language[0]["losses"]


def global_batches(outcomes: list[dict | None]) -> list[list[int]]:
    """Per iteration, the samples every language rank consumed together."""
    language = [o for o in outcomes if o is not None and o["module"] == "language"]
    return [sorted(i for o in language for i in o["samples"][n]) for n in range(len(language[0]["samples"]))]


def test_losses_after_resuming_on_other_layouts_equal_the_uninterrupted_runs(gloo_pool, tmp_path):
    first, second = str(tmp_path / "after-1"), str(tmp_path / "after-2")
    jobs = [
        {"components": A, "iterations": 3, "stop_after": 1, "save": first},  # saved on language dp 2 + vision dp 2
        {"components": A, "iterations": 3},  # the uninterrupted run
        {"components": B, "iterations": 3, "resume": first, "save": second},  # resumed on language dp 2 + vision dp 1
        {"components": B, "iterations": 5, "resume": second},  # that run going on, on its layout
        {"components": C, "iterations": 5, "resume": second},  # resumed on language dp 4 + vision dp 2
    ]
    per_rank = gloo_pool.run(train_jobs, jobs, timeout=900)
    outcomes = [[rank[job] for rank in per_rank] for job in range(len(jobs))]
    for job, iterations in ((2, [2, 3]), (3, [4, 5]), (4, [4, 5])):
        assert all(o["iterations"] == iterations for o in outcomes[job] if o is not None), job
    uninterrupted, on_b = language_losses(outcomes[1]), language_losses(outcomes[2])
    assert len(set(uninterrupted)) == 3  # SGD changed the model
    assert all(math.isclose(got, want, rel_tol=RTOL) for got, want in zip(on_b, uninterrupted[1:], strict=True)), (on_b, uninterrupted)
    assert global_batches(outcomes[2]) == global_batches(outcomes[1])[1:]
    going_on, on_c = language_losses(outcomes[3]), language_losses(outcomes[4])
    assert all(math.isclose(got, want, rel_tol=RTOL) for got, want in zip(on_c, going_on, strict=True)), (on_c, going_on)
    assert global_batches(outcomes[4]) == global_batches(outcomes[3])
