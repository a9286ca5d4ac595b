"""SIGTERM and SIGINT to a running job (real launches): every rank stops within seconds, no process is left
behind, one line says so (exit 143 / 130); with --save-state, SIGTERM first saves a complete state at the
next micro-batch boundary, and resuming from it gives exactly the uninterrupted stream.

Each launch proves several promises at once, since starting ranks is most of what this tier costs: the spawned
SIGTERM launch is also the launcher's proof that spawned ranks consume the pool's stream, and the torchrun launch
is torchrun's (the resumes run in the pool: the per-rank body is the same, and the stream before the signal came
from the launched ranks). A spawned run to its end, with its summary, is the wheel check's (scripts/check_wheel.sh)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_pool import shared_pool
from job_runs import read_dumps, run_in_pool

pytestmark = pytest.mark.launch

# Three ranks (language dp 2 fed by images dp 1): unequal DP sizes, and a rank fewer to start per launch than the
# default layout (each rank's start imports torch and the processor's stack, most of what a launch costs here).
RANKS = 3
FLAGS = ["--component", "language=dp=2,rank_offset=0", "--component", "images=dp=1,rank_offset=2",
         "--micro-batch-size", "4", "--embedded-samples", "48", "--seed", "4", "--quiet", "--scalable-dp",
         "--intra-microbatch-reorder", "--reorder-window-size", "2"]
LONG = ["--steps", "400"]  # far more than is read before the signal
STOP_WITHIN_S = 5.0


def children(pid: int) -> set[int]:
    """Every descendant of ``pid`` now (Linux /proc)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = {int(child) for child in (task / "children").read_text().split()}
            except OSError:
                continue
            todo.extend(kids - found)
            found |= kids
    return found


def direct_children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").glob("*") for child in (task / "children").read_text().split()]


def rank_server(launcher: int) -> int:
    """The launcher's rank server: multiprocessing's forkserver, a child of the launcher."""
    for child in direct_children(launcher):
        if b"multiprocessing.forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
            return child
    raise AssertionError(f"no rank server under the launcher {launcher}")


def spawned_ranks(launcher: int) -> list[int]:
    """The rank processes of a job our launcher started, in rank order: the children of its rank server, which
    forks them one after the other."""
    return sorted(direct_children(rank_server(launcher)))


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def start(argv: list[str], dumps: Path, torchrun: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), "-m"] if torchrun else [sys.executable, "-m"]
    return subprocess.Popen([*launcher, "mimo_pipes.cli.main", "run", *argv, "--dump-assignments", str(dumps)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def first_microbatches(process: subprocess.Popen, dumps: Path, ranks: int = RANKS) -> None:
    """Wait until every rank consumed a micro-batch."""
    deadline = time.monotonic() + 240
    while not (len(list(dumps.glob("rank*.jsonl"))) == ranks and all(p.stat().st_size for p in dumps.glob("rank*.jsonl"))):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no micro-batch within 240 s"
        time.sleep(0.1)


def signal_after_first_microbatches(process: subprocess.Popen, dumps: Path, signum: int, ranks: int = RANKS) -> tuple[float, set[int]]:
    """Wait until every rank consumed a micro-batch, then send ``signum``; (seconds to exit, processes it had)."""
    first_microbatches(process, dumps, ranks)
    family = children(process.pid)
    sent = time.monotonic()
    process.send_signal(signum)
    process.wait(timeout=60)
    return time.monotonic() - sent, family


def test_sigint_stops_every_rank_quickly_and_leaves_nothing(tmp_path):
    """Without --save-state: SIGINT (Ctrl-C) stops the job; SIGTERM's stop is the save test's below. The ranks
    were forked by the launcher's rank server, which holds one thread (it forks no other thread's state)."""
    process = start([*FLAGS, *LONG], tmp_path / "dumps")
    first_microbatches(process, tmp_path / "dumps")
    assert len(spawned_ranks(process.pid)) == RANKS and len(list(Path(f"/proc/{rank_server(process.pid)}/task").iterdir())) == 1
    seconds, family = signal_after_first_microbatches(process, tmp_path / "dumps", signal.SIGINT)
    stdout, stderr = process.communicate()
    assert process.returncode == 130, stderr
    assert seconds < STOP_WITHIN_S, seconds
    assert len(family) >= RANKS and not alive(family)  # the ranks (and their workers) are gone
    assert stderr.strip().splitlines()[-1] == "mimo-pipes run: stopped by SIGINT", stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr


def uninterrupted(steps: int) -> list[dict]:
    """The same job run straight through (the per-rank body in the pool): every rank's micro-batches."""
    import tempfile

    directory = Path(tempfile.mkdtemp())
    run_in_pool(shared_pool(), [*FLAGS, "--steps", str(steps), "--dump-assignments", str(directory)])
    return read_dumps(directory)


@pytest.mark.parametrize("torchrun", [False, True], ids=["spawned", "torchrun"])
def test_sigterm_saves_a_complete_state_and_the_resume_is_exact(tmp_path, torchrun):
    dumps, state = tmp_path / "dumps", tmp_path / "state"
    process = start([*FLAGS, *LONG, "--save-state", str(state)], dumps, torchrun=torchrun)
    seconds, family = signal_after_first_microbatches(process, dumps, signal.SIGTERM)
    stdout, stderr = process.communicate()
    assert seconds < STOP_WITHIN_S, seconds
    assert len(family) >= RANKS and not alive(family)
    assert "Traceback" not in stderr or torchrun, stderr  # torchrun's agent prints its own report
    saved = {len(lines) for lines in (p.read_text().splitlines() for p in dumps.glob("rank*.jsonl"))}
    assert len(saved) == 1, saved  # every rank stopped at the same boundary
    consumed = saved.pop()
    if not torchrun:
        assert process.returncode == 143, stderr
        assert stderr.strip().splitlines()[-1] == (
            f"mimo-pipes run: stopped by SIGTERM; saved a complete state after {consumed} micro-batches to {state}")
    from mimo_pipes.checkpoint import open_generation

    assert open_generation(state).consumed == consumed
    steps = consumed + 3
    run_in_pool(shared_pool(), [*FLAGS, "--steps", str(steps), "--resume", str(state), "--dump-assignments", str(dumps)])
    full = uninterrupted(steps)
    assert read_dumps(dumps) == full  # the launched ranks' micro-batches, then the resumed ones: the uninterrupted stream
