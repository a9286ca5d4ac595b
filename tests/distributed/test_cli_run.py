"""`mimo-pipes run` end to end: the real processor, dumps, save and resume, through the per-rank body every
rank of `run` calls (in the warm Gloo pool); and, marked `launch`, a run under torchrun giving the very same
stream (spawned ranks are launched, and their stream compared with the pool's, by tests/launch/test_signals.py's
SIGTERM test; a spawned run to its end and its summary by the wheel check, scripts/check_wheel.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_pool import shared_pool
from scenarios_jobs import run_job

SMALL = ["--steps", "6", "--micro-batch-size", "4", "--embedded-samples", "48", "--quiet", "--seed", "9"]
REORDER = ["--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2"]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "mimo_pipes.cli.main", "run", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def read_dumps(directory: Path) -> dict[int, list[dict]]:
    return {
        int(path.stem[4:]): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(directory.glob("rank*.jsonl"))
    }


def in_pool(pool, *argv: str) -> dict:
    """Rank 0's outcome of ``mimo-pipes run ARGV`` in the pool (every rank ran the job)."""
    outcomes = pool.run(run_job, list(argv), timeout=300)
    assert all(outcome is None for outcome in outcomes[4:])  # the pool's ranks beyond the job's
    return outcomes[0]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    pool = shared_pool()
    directory = tmp_path_factory.mktemp("full")
    return in_pool(pool, *SMALL, *REORDER, "--dump-assignments", str(directory)), read_dumps(directory)


def test_default_layout_runs_and_prints_the_summary(uninterrupted):
    outcome, dumps = uninterrupted
    assert "language dp=2 + images dp=2" in outcome["stdout"]
    lines = {line.split()[0]: line.split() for line in outcome["stdout"].splitlines() if line.split() and line.split()[0] in ("language", "images")}
    assert set(lines) == {"language", "images"}
    # Both modules consumed the same samples and image tokens; spread after is no worse than before.
    assert lines["language"][3:5] == lines["images"][3:5]
    assert float(lines["language"][6]) <= float(lines["language"][5])
    assert sorted(dumps) == [0, 1, 2, 3]
    for records in dumps.values():
        assert [r["step"] for r in records] == list(range(6))
        for record in records:
            assert set(record) == {"module", "dp_rank", "dp_size", "step", "sample_ids", "image_tokens", "real_tokens"}
            assert len(record["sample_ids"]) == 2 and record["dp_size"] == 2
    for step in range(6):  # modules agree: language rank r and images rank r hold the same samples
        assert dumps[0][step]["sample_ids"] == dumps[2][step]["sample_ids"]
        assert dumps[1][step]["sample_ids"] == dumps[3][step]["sample_ids"]


@pytest.fixture(scope="module")
def saved_state(tmp_path_factory):
    """The first half of an interrupted run: 3 micro-batches, dumps and state."""
    pool = shared_pool()
    root = tmp_path_factory.mktemp("interrupted")
    state, dumps = root / "state", root / "dumps"
    outcome = in_pool(pool, *SMALL, *REORDER, "--dump-assignments", str(dumps), "--stop-after", "3", "--save-state", str(state))
    assert f"saved state after 3 micro-batches to {state}" in outcome["stdout"]
    return state, dumps


def test_stop_save_and_resume_continue_the_same_stream(gloo_pool, uninterrupted, saved_state):
    _, full = uninterrupted
    state, dumps = saved_state
    from mimo_pipes.checkpoint import open_generation

    generation = open_generation(state)
    generation.verify()
    assert (generation.consumed, generation.world_size) == (3, 4)
    assert all(len(records) == 3 for records in read_dumps(dumps).values())
    outcome = in_pool(gloo_pool, *SMALL, *REORDER, "--dump-assignments", str(dumps), "--resume", str(state))
    assert "micro-batches 3..5," in outcome["stdout"]
    assert read_dumps(dumps) == full  # steps 0..2 then 3..5, identical to the uninterrupted run


def test_resume_with_other_settings_is_refused(saved_state, capsys):
    from mimo_pipes.cli.main import main

    state, _ = saved_state
    assert main(["run", *SMALL, *REORDER[:2], "--resume", str(state)]) == 2  # refused before any rank starts
    err = capsys.readouterr().err
    assert err.strip().startswith("mimo-pipes run: error: --resume:")
    assert "reorder" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--embedded-samples", "64"], "--embedded-samples 48, this run has 64"),
        (["--seq-length", "1024"], "--seq-length 2048, this run has 1024"),
        (["--processor", "EMBEDDED"], "--processor unset (the default), this run has "),
    ],
)
def test_resume_refuses_other_data_or_processing_naming_the_flag(saved_state, flags, named, capsys):
    from mimo_pipes.cli.main import main
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path

    state, _ = saved_state
    flags = [str(default_processor_path()) if flag == "EMBEDDED" else flag for flag in flags]
    assert main(["run", *SMALL, *REORDER, *flags, "--resume", str(state)]) == 2  # refused before any rank starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --resume: {state} was saved with {named}"), err


def test_summary_says_when_the_data_ended_before_steps(gloo_pool):
    # 16 samples of micro-batches of 4, read once: 4 micro-batches, fewer than the 10 asked for.
    outcome = in_pool(gloo_pool, "--steps", "10", "--micro-batch-size", "4", "--embedded-samples", "16", "--quiet",
                      "--dataloader-type", "single", *REORDER)
    assert "micro-batches 0..3," in outcome["stdout"]
    assert "the data ended after 4 micro-batches, before the 10 asked for (--steps)" in outcome["stdout"]
    assert {s.module: s.steps for s in outcome["result"].summaries} == {"language": 4, "images": 4}


@pytest.mark.launch
def test_runs_under_torchrun_with_the_same_stream(tmp_path):
    """Three ranks of unequal DP sizes (one fewer to start than the default layout) under torchrun: the stream
    the pool's ranks consume for the same flags."""
    three = ["--component", "language=dp=2,rank_offset=0", "--component", "images=dp=1,rank_offset=2"]
    expected, dumps = tmp_path / "expected", tmp_path / "dumps"
    in_pool(shared_pool(), *three, *SMALL, *REORDER, "--dump-assignments", str(expected))
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         "-m", "mimo_pipes.cli.main", "run", *three, *SMALL, *REORDER, "--dump-assignments", str(dumps)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "language dp=2 + images dp=1" in result.stdout
    assert read_dumps(dumps) == read_dumps(expected)
