"""`mimo-pipes run` end to end: real processor, spawned Gloo ranks, dumps, save and resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("full")
    result = run_cli(*SMALL, *REORDER, "--dump-assignments", str(directory))
    assert result.returncode == 0, result.stderr
    return result, read_dumps(directory)


def test_default_layout_runs_and_prints_the_summary(uninterrupted):
    result, dumps = uninterrupted
    assert "language dp=2 + images dp=2" in result.stdout
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.split() and line.split()[0] in ("language", "images")}
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
    root = tmp_path_factory.mktemp("interrupted")
    state, dumps = root / "state", root / "dumps"
    first = run_cli(*SMALL, *REORDER, "--dump-assignments", str(dumps), "--stop-after", "3", "--save-state", str(state))
    assert first.returncode == 0, first.stderr
    return state, dumps


def test_stop_save_and_resume_continue_the_same_stream(uninterrupted, saved_state):
    _, full = uninterrupted
    state, dumps = saved_state
    assert (state / "meta.json").is_file() and len(list(state.glob("rank*.json"))) == 4
    assert all(len(records) == 3 for records in read_dumps(dumps).values())
    second = run_cli(*SMALL, *REORDER, "--dump-assignments", str(dumps), "--resume", str(state))
    assert second.returncode == 0, second.stderr
    assert read_dumps(dumps) == full  # steps 0..2 then 3..5, identical to the uninterrupted run


def test_resume_with_other_settings_is_refused(saved_state):
    state, _ = saved_state
    other = run_cli(*SMALL, *REORDER[:2], "--resume", str(state))
    assert other.returncode == 2
    assert other.stderr.strip().startswith("mimo-pipes run: error: --resume:")
    assert "reorder" in other.stderr and "Traceback" not in other.stderr


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
    from mimo_pipes.data.processor import default_processor_path

    state, _ = saved_state
    flags = [str(default_processor_path()) if flag == "EMBEDDED" else flag for flag in flags]
    assert main(["run", *SMALL, *REORDER, *flags, "--resume", str(state)]) == 2  # refused before any rank starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --resume: {state} was saved with {named}"), err


def test_runs_under_torchrun_with_the_same_stream(uninterrupted, tmp_path):
    _, full = uninterrupted
    dumps = tmp_path / "dumps"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "-m", "mimo_pipes.cli.main", "run", *SMALL, *REORDER, "--dump-assignments", str(dumps)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "language dp=2 + images dp=2" in result.stdout
    assert read_dumps(dumps) == full


def test_summary_says_when_the_data_ended_before_steps():
    # 16 samples of micro-batches of 4, read once: 4 micro-batches, fewer than the 10 asked for.
    result = run_cli("--steps", "10", "--micro-batch-size", "4", "--embedded-samples", "16", "--quiet",
                     "--dataloader-type", "single", *REORDER)
    assert result.returncode == 0, result.stderr
    assert "micro-batches 0..3," in result.stdout
    assert "the data ended after 4 micro-batches, before the 10 asked for (--steps)" in result.stdout
    steps = {line.split()[0]: int(line.split()[2]) for line in result.stdout.splitlines()
             if line.split() and line.split()[0] in ("language", "images")}
    assert steps == {"language": 4, "images": 4}
