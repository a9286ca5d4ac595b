"""`mimo-pipes run --resume` on another layout (its per-rank body in the Gloo pool): a state saved by language
dp 2 + images dp 2 inside a window of 4 whose samples move between micro-batches continues, on language
dp 1 + images dp 1 and on images dp 2 first + language tp 2 dp 2, the uninterrupted run's global stream;
a change that would alter that stream is refused before any rank starts, in one line naming the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_pool import shared_pool
from job_runs import run_in_pool

from mimo_pipes.cli.main import main

SMALL = ["--micro-batch-size", "4", "--embedded-samples", "48", "--quiet", "--seed", "9", "--scalable-dp", "--intra-microbatch-reorder",
         "--reorder-window-size", "4", "--reorder-across-microbatches", "--skip-bad-samples"]
SAVED = ["--component", "language=dp=2", "--component", "images=dp=2,rank_offset=2"]
STEPS, WINDOW, SAVED_AT = 12, 4, 5
OTHER_LAYOUTS = {
    "language dp 1 + images dp 1": ["--component", "language=dp=1", "--component", "images=dp=1,rank_offset=1"],
    "images first, language tp 2 dp 2": ["--component", "images=dp=2", "--component", "language=tp=2,dp=2,rank_offset=2"],
}


def dumps_by_step(directory: Path) -> dict[str, dict[int, list[int]]]:
    """Per module, per global micro-batch, the samples its DP ranks consumed (TP peers hold the same)."""
    seen: dict[tuple, list[int]] = {}
    for path in sorted(directory.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            seen[(record["module"], record["dp_rank"], record["step"])] = record["sample_ids"]
    out: dict[str, dict[int, list[int]]] = {}
    for (module, _, step), ids in sorted(seen.items()):
        out.setdefault(module, {}).setdefault(step, []).extend(ids)
    return {module: {step: sorted(ids) for step, ids in steps.items()} for module, steps in out.items()}


def paired(directory: Path) -> bool:
    """On every step, images DP rank i holds the samples of language DP ranks i*k .. (i+1)*k - 1, in order."""
    ids, sizes = {}, {}
    for path in directory.glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            ids[(record["module"], record["dp_rank"], record["step"])] = record["sample_ids"]
            sizes[record["module"]] = record["dp_size"]
    k = sizes["language"] // sizes["images"]
    return all(ids[("images", i, step)] == [s for j in range(i * k, (i + 1) * k) for s in ids[("language", j, step)]]
               for (module, i, step) in ids if module == "images")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The uninterrupted run and a state saved inside its second window, on language dp 2 + images dp 2."""
    pool, root = shared_pool(), tmp_path_factory.mktemp("elastic")
    run_in_pool(pool, [*SMALL, *SAVED, "--steps", str(STEPS), "--dump-assignments", str(root / "full")])
    outcome = run_in_pool(pool, [*SMALL, *SAVED, "--steps", str(STEPS), "--stop-after", str(SAVED_AT), "--save-state", str(root / "state")])
    assert f"saved state after {SAVED_AT} micro-batches" in outcome["stdout"]
    return root / "state", dumps_by_step(root / "full")


@pytest.mark.parametrize("layout", sorted(OTHER_LAYOUTS))
def test_run_resumes_on_another_layout_with_the_same_global_stream(gloo_pool, saved, layout, tmp_path):
    state, full = saved
    outcome = run_in_pool(gloo_pool, [*SMALL, *OTHER_LAYOUTS[layout], "--steps", str(STEPS), "--resume", str(state),
                                      "--dump-assignments", str(tmp_path)])
    assert f"micro-batches {SAVED_AT}..{STEPS - 1}," in outcome["stdout"]
    got = dumps_by_step(tmp_path)
    assert paired(tmp_path)
    for module in ("language", "images"):
        assert sorted(got[module]) == list(range(SAVED_AT, STEPS))
        for step in range(SAVED_AT, WINDOW * 2):  # the rest of the window the state was saved in, as saved
            assert got[module][step] == full[module][step], (module, step)
        later = range(WINDOW * 2, STEPS)  # a later window: samples may sit in other micro-batches, the window holds the same
        assert sorted(i for step in later for i in got[module][step]) == sorted(i for step in later for i in full[module][step])


@pytest.mark.parametrize("flags, setting, why", [
    (["--micro-batch-size", "8"], "--micro-batch-size 4, this run has 8", "decides which samples form every global micro-batch"),
    (["--seed", "10"], "--seed 9, this run has 10", "the seed decides the order"),
    (["--embedded-samples", "64"], "--embedded-samples 48, this run has 64", "the data is what every global micro-batch is drawn from"),
    (["--reorder-window-size", "2"], "--reorder-window-size 4, this run has 2", "windows are balanced as a whole"),
], ids=["global micro-batch size", "seed", "dataset", "window size"])
def test_resume_on_another_layout_refuses_what_changes_the_stream(saved, capsys, flags, setting, why):
    state, _ = saved
    argv = [*SMALL, *OTHER_LAYOUTS["language dp 1 + images dp 1"], "--steps", str(STEPS), "--resume", str(state), *flags]
    assert main(["run", *argv]) == 2  # before any rank starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --resume: {state} was saved with {setting}: "), err
    assert why in err[0]


def test_resume_refuses_other_modules(saved, capsys):
    state, _ = saved
    argv = [*SMALL, "--component", "language=dp=1", "--component", "vision=dp=1,rank_offset=1", "--steps", str(STEPS), "--resume", str(state)]
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mimo-pipes run: error: --resume: {state} was saved with --component modules images, language, this run has modules "
                   "language, vision: a run resumes on another layout (DP, TP, PP, rank offsets) of the same modules, each continuing its own state"]
