"""kill -9 of one rank of a running job (a real launch): the launcher names the rank that died, and no rank
prints the transport's raw text (Gloo's ``pair.cc ... Connection reset by peer``): each says in one line
that it lost a peer."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_signals import FLAGS, alive, children, start

pytestmark = pytest.mark.launch


def rank_processes(launcher: int) -> list[int]:
    """The launcher's rank processes, in rank order (it starts them one after the other)."""
    direct = set()
    for task in Path(f"/proc/{launcher}/task").glob("*"):
        direct |= {int(child) for child in (task / "children").read_text().split()}
    ranks = [pid for pid in direct if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    return sorted(ranks)


def test_a_rank_killed_outright_is_named_and_its_peers_say_so_in_one_line(tmp_path):
    dumps = tmp_path / "dumps"
    process = start([*FLAGS, "--steps", "100000", "--exchange-timeout", "20"], dumps)
    deadline = time.monotonic() + 240
    while not (len(list(dumps.glob("rank*.jsonl"))) == 4 and all(p.stat().st_size for p in dumps.glob("rank*.jsonl"))):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no micro-batch within 240 s"
        time.sleep(0.1)
    family = children(process.pid)
    ranks = rank_processes(process.pid)
    assert len(ranks) == 4, ranks
    victim = 2  # an encoder rank: its module's peer and the language ranks lose it
    os.kill(ranks[victim], signal.SIGKILL)
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert f"mimo-pipes run: rank {victim} was killed by SIGKILL; the other ranks cannot go on without it" in lines, stderr
    failed = [line for line in lines if line.startswith("mimo-pipes run: failed on")]
    assert len(failed) == 1 and re.fullmatch(rf"mimo-pipes run: failed on rank\(s\) [0-9, ]+ \(rank {victim} was killed by SIGKILL first\)", failed[0]), stderr
    assert "pair.cc" not in stderr and "Traceback" not in stderr and "third_party" not in stderr, stderr
    peers = [line for line in lines if re.match(r"mimo-pipes run: rank \d+: ", line)]
    assert peers and all("(connection" in line or "(timed out" in line or "(broken pipe" in line for line in peers), peers
    deadline = time.monotonic() + 30  # multiprocessing's resource tracker frees the dead rank's semaphores, then ends
    while alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(family)
