"""kill -9 of one rank of a running job (a real launch, by our launcher and by torchrun): every surviving rank
says in one line that it stopped and which rank died (the job's roll, ``exchange/roll_verdicts.py``), never the
transport's raw text (Gloo's ``pair.cc ... Connection reset by peer``); the job ends within seconds of the
kill, not at the exchange's timeout (the launcher stops the others as torchrun's agent does), and leaves no
process behind."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_signals import FLAGS, RANKS, alive, children, spawned_ranks, start

pytestmark = pytest.mark.launch

ENDS_WITHIN_S = 30.0  # from the kill to the job's exit; the exchange's timeout is left at its default, 120 s


def torchrun_worker(agent: int, rank: int) -> int:
    """The torchrun worker of global ``rank``: the agent's child with ``RANK=rank`` in its environment."""
    for task in Path(f"/proc/{agent}/task").glob("*"):
        for child in map(int, (task / "children").read_text().split()):
            if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
                return child
    raise AssertionError(f"no worker of rank {rank}")


@pytest.mark.parametrize("torchrun, victim", [(False, 0), (True, 2)], ids=["spawned", "torchrun"])
def test_a_rank_killed_outright_is_named_by_every_survivor_in_one_line(tmp_path, torchrun, victim):
    """Spawned: rank 0 (the process group's store would live there; the roll is the launcher's). torchrun: an
    encoder rank. Either way the survivors are stopped by SIGTERM or lose the dead rank in a collective."""
    dumps = tmp_path / "dumps"
    process = start([*FLAGS, "--steps", "100000"], dumps, torchrun=torchrun)
    try:
        deadline = time.monotonic() + 240
        while not (len(list(dumps.glob("rank*.jsonl"))) == RANKS and all(p.stat().st_size for p in dumps.glob("rank*.jsonl"))):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no micro-batch within 240 s"
            time.sleep(0.1)
        family = children(process.pid)
        killed = time.monotonic()
        os.kill(torchrun_worker(process.pid, victim) if torchrun else spawned_ranks(process.pid)[victim], signal.SIGKILL)
        _, stderr = process.communicate(timeout=180)
        ended = time.monotonic() - killed
    except BaseException:
        for pid in alive(children(process.pid)) | ({process.pid} if process.poll() is None else set()):
            os.kill(pid, signal.SIGKILL)  # nothing of a failed test's job is left for the next
        raise
    assert process.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    ours = [line for line in lines if re.match(r"mimo-pipes run: rank \d+: ", line)]
    said = {int(re.match(r"mimo-pipes run: rank (\d+): ", line).group(1)) for line in ours}
    assert len(ours) == RANKS - 1 and said == set(range(RANKS)) - {victim}, stderr  # one line per survivor
    named = f"; rank {victim} died (its process ended without a word: killed or crashed)"
    assert all(line.endswith(named) for line in ours), ours
    assert all(re.search(r": stopped by SIGTERM;|\((connection|timed out|broken pipe)", line) for line in ours), ours
    assert not any("pair.cc" in line or "third_party" in line for line in ours), ours
    if not torchrun:  # torchrun's own report (its traceback included) follows our lines
        assert f"mimo-pipes run: rank {victim} was killed by SIGKILL; the other ranks cannot go on without it: stopping them" in lines, stderr
        failed = [line for line in lines if line.startswith("mimo-pipes run: failed on")]
        assert len(failed) == 1, stderr
        assert re.fullmatch(rf"mimo-pipes run: failed on rank\(s\) [0-9, ]+ \(rank {victim} was killed by SIGKILL first\)", failed[0]), stderr
        assert "pair.cc" not in stderr and "Traceback" not in stderr and "third_party" not in stderr, stderr
        assert "leaked semaphore" not in stderr and "Warning" not in stderr, stderr  # the tracker frees the dead rank's, quietly
    assert ended < ENDS_WITHIN_S, (ended, stderr)
    deadline = time.monotonic() + 30  # multiprocessing's resource tracker frees the dead rank's semaphores, then ends
    while alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(family)
