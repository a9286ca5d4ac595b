"""Real launches killed while they save (launch tier): a job resumes from a complete generation, is asked to
stop (so it saves at the next boundary into the same folder) and is killed during that save, its launcher
outright or one of its ranks. The folder then resumes as the previous generation or the new one, exactly
(the stream continues as the uninterrupted run's), and the dead job's lock does not block the next one."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dist_pool import shared_pool
from job_runs import read_dumps, run_in_pool
from test_signals import FLAGS, LONG, RANKS, alive, children, spawned_ranks, start

from mimo_pipes.checkpoint import acquire_save_lock, open_generation

pytestmark = pytest.mark.launch


def generations(state: Path) -> set[str]:
    return {path.name for path in state.glob("generation-*")}


def kill_during_the_save(process, state: Path, dumps: Path, victim: str) -> None:
    """Once every rank consumed past the saved state, SIGTERM the launcher (the ranks save at their next
    boundary) and kill ``victim`` (``launcher`` or ``rank``) the moment the new generation's folder shows."""
    before, deadline = generations(state), time.monotonic() + 240
    while not all(len(p.read_text().splitlines()) > 2 for p in dumps.glob("rank*.jsonl")) or len(list(dumps.glob("rank*.jsonl"))) < RANKS:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    family = children(process.pid)
    ranks = spawned_ranks(process.pid)
    process.send_signal(signal.SIGTERM)
    until = time.monotonic() + 10
    while generations(state) <= before and time.monotonic() < until:
        time.sleep(0.001)
    if victim == "launcher":
        process.kill()
    else:
        # A rank still in the save: one that wrote its part first may have exited already (and been reaped).
        for pid in sorted(ranks, reverse=True):
            try:
                os.kill(pid, signal.SIGKILL)
                break
            except ProcessLookupError:
                continue
    process.wait(timeout=120)
    deadline = time.monotonic() + 30
    while alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(family)


@pytest.mark.parametrize("victim", ["launcher", "rank"])
def test_a_job_killed_during_its_save_leaves_a_complete_generation(tmp_path, victim):
    pool = shared_pool()
    state, dumps = tmp_path / "state", tmp_path / "dumps"
    run_in_pool(pool, [*FLAGS, "--steps", "2", "--save-state", str(state), "--dump-assignments", str(dumps)])
    assert open_generation(state).consumed == 2
    process = start([*FLAGS, *LONG, "--exchange-timeout", "15", "--resume", str(state), "--save-state", str(state)], dumps)
    kill_during_the_save(process, state, dumps, victim)
    generation = open_generation(state)
    generation.verify()  # whole: the previous generation, or the new one
    consumed = generation.consumed
    acquire_save_lock(state, "the next job").release()  # the dead job's lock is taken over
    steps = consumed + 2
    resumed = tmp_path / "resumed"
    outcome = run_in_pool(pool, [*FLAGS, "--steps", str(steps), "--resume", str(state), "--dump-assignments", str(resumed)])
    assert f"micro-batches {consumed}..{steps - 1}," in outcome["stdout"]
    full = tmp_path / "full"
    run_in_pool(pool, [*FLAGS, "--steps", str(steps), "--dump-assignments", str(full)])
    assert read_dumps(resumed) == [record for record in read_dumps(full) if record["step"] >= consumed]
