"""Elastic resume over real Gloo ranks (the pool): a state saved by language dp 2 + images dp 2 at every
position inside a window of 4 (windows in flight on the prefetch thread, bad rows replaced) resumes on
language dp 1 + images dp 1 and on language dp 4 + images dp 2. From the resume point on, every global
micro-batch holds exactly the uninterrupted run's samples (with samples moving between micro-batches: the
rest of the window the state was saved in, micro-batch by micro-batch, and every later window as a whole),
and on the new layout both modules still hold the same samples on every rank (the fan-out pairing)."""

from __future__ import annotations

import pytest
from scenarios_elastic import elastic_resume

SAVE = ["language=dp=2", "images=dp=2,rank_offset=2"]
RESUME = [["language=dp=1", "images=dp=1,rank_offset=1"], ["language=dp=4", "images=dp=2,rank_offset=4"]]
# Two levels: the encoder replicas (two, then one) change the plan of every module, the language module's
# own layout included, which restores its own ranks' states as they are.
TWO_LEVEL_SAVE = ["language=dp=4", "images=dp=2,rank_offset=4"]
TWO_LEVEL_RESUME = [["language=dp=4", "images=dp=1,rank_offset=4"], ["language=dp=2", "images=dp=1,rank_offset=2"]]
STEPS, WINDOW = 12, 4
POINTS = [4, 5, 6, 7]  # every position inside the second window
BAD = [3, 30, 61, 77]


def by_step(records: list[dict], module: str) -> dict[int, list[int]]:
    """The samples a module's ranks consumed together at each global micro-batch (their union)."""
    out: dict[int, list[int]] = {}
    for record in records:
        if record["module"] == module:
            out.setdefault(record["step"], []).extend(record["sample_ids"])
    return {step: sorted(ids) for step, ids in sorted(out.items())}


def by_window(steps: dict[int, list[int]], first: int) -> dict[int, list[int]]:
    """Whole windows from ``first`` on (a window's samples over its micro-batches)."""
    out: dict[int, list[int]] = {}
    for step, ids in steps.items():
        if step >= first:
            out.setdefault(step // WINDOW, []).extend(ids)
    return {window: sorted(ids) for window, ids in out.items()}


def assert_paired(records: list[dict]) -> None:
    """Encoder rank i holds, in order, the samples of language ranks i*k .. (i+1)*k - 1 at every step."""
    ids = {(r["module"], r["dp_rank"], r["step"]): r["sample_ids"] for r in records}
    language_dp = max(r["dp_size"] for r in records if r["module"] == "language")
    images_dp = max(r["dp_size"] for r in records if r["module"] == "images")
    k = language_dp // images_dp
    for step in {r["step"] for r in records}:
        for i in range(images_dp):
            fed = [sample for j in range(i * k, (i + 1) * k) for sample in ids[("language", j, step)]]
            assert ids[("images", i, step)] == fed, (step, i)


@pytest.mark.parametrize("across", [False, True], ids=["within micro-batches", "across micro-batches"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no overlap"])
def test_a_state_resumes_on_other_layouts_with_the_same_global_stream(gloo_pool, across, overlap):
    outcome = next(r for r in gloo_pool.run(elastic_resume, SAVE, RESUME, steps=STEPS, points=POINTS, window=WINDOW,
                                            across=across, overlap=overlap, bad_rows=BAD, timeout=600) if r)
    check(outcome, RESUME, across)


def test_two_level_balance_resumes_on_other_encoder_replicas(gloo_pool):
    outcome = next(r for r in gloo_pool.run(elastic_resume, TWO_LEVEL_SAVE, TWO_LEVEL_RESUME, steps=STEPS, points=POINTS,
                                            window=WINDOW, across=True, overlap=True, bad_rows=BAD, two_level=True, timeout=600) if r)
    check(outcome, TWO_LEVEL_RESUME, across=True)


def check(outcome: dict, layouts: list[list[str]], across: bool) -> None:
    reference = by_step(outcome["uninterrupted"], "language")
    assert reference == by_step(outcome["uninterrupted"], "images") and sorted(reference) == list(range(STEPS))
    assert not {i for ids in reference.values() for i in ids} & set(BAD)  # every bad row was replaced
    for layout, resumed in outcome["resumed"].items():
        for point, records in resumed.items():
            where = f"{layouts[layout]}, resumed after {point}"
            assert_paired(records)
            for module in ("language", "images"):
                got = by_step(records, module)
                assert sorted(got) == list(range(point, STEPS)), where
                window_end = -(-point // WINDOW) * WINDOW
                for step in range(point, window_end):  # the window the state was saved in: its micro-batches as saved
                    assert got[step] == reference[step], (where, module, step)
                if across:
                    assert by_window(got, window_end) == by_window(reference, window_end), (where, module)
                else:
                    assert got == {step: ids for step, ids in reference.items() if step >= point}, (where, module)
