"""The tiny MIMO trainer on real Gloo ranks: losses do not depend on reordering; resume reproduces them.

Tolerance: the loss of a global batch is a float64 sum of per-token float32 losses divided by the global
token count. Reordering changes which rank and micro-batch computes a sample, so each token's loss can
differ in its last float32 bits (matrix products of differently composed batches round differently) and
the gradients are summed in another order; one SGD step carries that into iteration 2. Relative 1e-5 is
about 100 float32 ulps: far above that noise, far below any change a lost, duplicated or mismatched sample
would make (one sample of a global batch of 8 moves the loss by ~1e-3 or more). Resume replays the same
operations in the same order, so it must match exactly.
"""

from __future__ import annotations

import math

import pytest
from scenarios_train import train_and_resume

LAYOUTS = {
    "language dp 2 + vision dp 2": ("language=dp=2,rank_offset=0", "images=dp=2,rank_offset=2"),
    "language dp 2 + vision dp 1": ("language=dp=2,rank_offset=0", "images=dp=1,rank_offset=2"),
}
# One global batch = 2 micro-batches of 4 samples; the window of 2 lets samples move between its micro-batches.
VARIANTS = {
    "off": {"reorder": False},
    "on": {"reorder": True},
    "on, window 2 across micro-batches": {"reorder": True, "window": 2, "across": True},
}
ITERATIONS = 2
RESUMED = "on, window 2 across micro-batches"
RTOL = 1e-5


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_losses_equal_with_reordering_off_and_on_and_after_resume(gloo_pool, tmp_path, layout) -> None:
    outcomes = [o for o in gloo_pool.run(train_and_resume, LAYOUTS[layout], VARIANTS, iterations=ITERATIONS,
                                         resume=RESUMED, checkpoint_dir=str(tmp_path), timeout=600) if o]
    language = [o for o in outcomes if o["module"] == "language"]
    vision = [o for o in outcomes if o["module"] == "images"]
    assert len(language) == 2 and vision
    reference = language[0]["runs"]["off"]["losses"]
    assert len(reference) == ITERATIONS and reference[0] != reference[1]  # SGD changed the model
    for outcome in language:
        for name, run in outcome["runs"].items():
            for got, want in zip(run["losses"], reference, strict=True):
                assert math.isclose(got, want, rel_tol=RTOL), (layout, name, got, want)
    for outcome in language + vision:
        uninterrupted, resumed = outcome["runs"][RESUMED], outcome["resumed"]
        assert resumed["iterations"] == uninterrupted["iterations"][1:] == list(range(2, ITERATIONS + 1))
        assert resumed["losses"] == uninterrupted["losses"][1:]  # bitwise
        assert resumed["microbatches"] == uninterrupted["microbatches"][2:]  # 2 micro-batches an iteration
        # The exchange's running totals continue across the resume (wall-clock times are each run's own).
        totals = _totals(resumed["metrics"])
        assert totals == _totals(uninterrupted["metrics"])
        assert totals["cumulative/microbatches"] == 2 * ITERATIONS and totals["cumulative/windows"] == ITERATIONS
    for name in VARIANTS:
        # Every global batch (2 micro-batches on each rank) holds the same samples in every variant.
        assert _global_batches(language, name) == _global_batches(language, "off")
        assert _global_batches(vision, name) == _global_batches(language, "off")
    # Reordering did move samples, so the equality above is not the trivial one.
    for name in ("on", "on, window 2 across micro-batches"):
        assert any(o["runs"][name]["microbatches"] != o["runs"]["off"]["microbatches"] for o in vision + language)


def _totals(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k.startswith("cumulative/") and not k.startswith("cumulative/time/")}


def _global_batches(outcomes, name) -> list[set[int]]:
    batches: list[set[int]] = [set() for _ in range(ITERATIONS)]
    for outcome in outcomes:
        for index, ids in enumerate(outcome["runs"][name]["microbatches"]):
            batches[index // 2].update(ids)
    return batches
