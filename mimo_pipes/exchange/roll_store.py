"""The roll on the job's store: signed by every rank when it joins, read by a rank that stops (judged in ``roll_verdicts.py``).

The roll needs a store that outlives every rank: the one torchrun's agent hosts, or our launcher's for
spawned ranks, both marked by ``TORCHELASTIC_USE_AGENT_STORE`` (every rank a client of it). Where rank 0
hosts the store instead (ranks started by hand with ``MASTER_ADDR`` and ``RANK``), nothing is signed and no
rank is named. Each rank keeps a client of its own with a short timeout, apart from the process group's
(whose timeout is the exchange's, and which is gone once the rank leaves the group). Nothing here runs per
step: one write when a rank joins, a few reads and writes when it ends. The roll never fails a job: a store
that does not answer leaves a rank unsigned, or its verdict unknown.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mimo_pipes.exchange.roll_verdicts import Signed, Verdict, judge, parse_pairs, parse_signed, signed_text

STORE_TIMEOUT_S = 5.0
REMOTE_WAIT_S = 3.0  # a rank that lost a peer it cannot see waits this long for the peer's node to report it
CALL_BOUND_S = REMOTE_WAIT_S + STORE_TIMEOUT_S  # however the store behaves, a rank's ending waits no longer


def node_identity() -> str | None:
    """This node as the kernel sees it: host name, boot id and pid namespace (None without /proc). Ranks
    with the same identity see each other's pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{socket.gethostname()}|{boot}|{namespace}"


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid`` if it still runs; None if it ended (a
    zombie, not yet reaped by its parent, has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])  # fields from the state on: starttime is the 22nd


@dataclass(frozen=True)
class Roll:
    """This rank's place on the roll: the store (under the roll's prefix), its node, its rank."""

    store: Any
    node: str
    rank: int
    world_size: int

    @property
    def host(self) -> str:
        return self.node.split("|", 1)[0]

    def read(self, key: str) -> str:
        # check() first: get() of a key not written yet would wait for the store's timeout
        return self.store.get(key).decode() if self.store.check([key]) else ""

    def verdict(self, lost_peer: bool) -> Verdict:
        """What this rank can tell of its peers; reports the ranks of its node it finds dead, for the other nodes."""
        here = parse_signed(self.read(f"node/{self.node}"))
        gone = {entry.rank for entry in here if entry.rank != self.rank and process_start(entry.pid) != entry.start}
        ended = parse_pairs(self.read("ended"))
        found = sorted(rank for rank in gone if rank not in ended)
        if found:
            self.store.append("dead", "".join(f"{rank}:{self.host}," for rank in found))
        verdict = judge(self.rank, self.world_size, here, gone, ended, parse_pairs(self.read("dead")))
        deadline = time.monotonic() + REMOTE_WAIT_S
        while lost_peer and not verdict.dead and verdict.unseen and time.monotonic() < deadline:
            time.sleep(0.2)  # the dead rank's node may report it a moment later
            verdict = judge(self.rank, self.world_size, here, gone, parse_pairs(self.read("ended")), parse_pairs(self.read("dead")))
        return verdict

    def end(self, ending: str) -> None:
        self.store.append("ended", f"{self.rank}:{ending},")


_roll: Roll | None = None  # this rank's, once signed
_signing_tried = False  # sign_roll() tries once a process


def sign(rank: int, world_size: int) -> Roll | None:
    """After joining the process group: write where this rank's process runs on the job's roll (nothing
    where the store does not outlive the ranks, or without /proc)."""
    global _roll
    node, start = node_identity(), process_start(os.getpid())
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or node is None or start is None:
        return None
    try:
        import torch.distributed as dist

        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                               wait_for_workers=False, timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
        # A torchrun restart may reuse its agent's store: each attempt has a roll of its own.
        attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        roll = Roll(dist.PrefixStore(f"mimo_pipes/roll/{attempt}/", client), node, rank, world_size)
        roll.store.append(f"node/{node}", signed_text(Signed(rank, os.getpid(), start)))
    except (RuntimeError, ValueError, KeyError, OSError):
        return None
    _roll = roll
    return roll


def sign_roll() -> Roll | None:
    """This rank's place on the roll, signed once (for ranks whose process group a training script joined itself,
    not :func:`~mimo_pipes.exchange.world.join_world`): the library's collectives call it first, so that a peer
    that dies in one of them can be named. Nothing outside a process group, or where the roll cannot be signed."""
    global _signing_tried
    if _roll is not None or _signing_tried:
        return _roll
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    _signing_tried = True
    return sign(dist.get_rank(), dist.get_world_size())


def host_store() -> tuple[Any, int]:
    """For spawned ranks: the job's store, hosted by the launcher (so that it outlives every rank) on a free
    port of this host; (the store, its port). The ranks join it as clients (``TORCHELASTIC_USE_AGENT_STORE``)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return store, store.port


def call_roll(ending: str, read: bool, roll: Roll | None = None) -> Verdict | None:
    """Say on the roll how this rank ended (one of ``roll.ENDINGS``); with ``read``, first the verdict on its
    peers (None: not signed, or the store did not answer in time). Bounded in time: a thread the store keeps
    waiting is left behind (the rank is ending). ``roll`` None: this rank's."""
    roll = roll or _roll
    if roll is None:
        return None
    outcome: list[Verdict | None] = [None]

    def call() -> None:
        try:
            outcome[0] = roll.verdict(ending == "peer") if read else None
            roll.end(ending)
        except (RuntimeError, ValueError, OSError):
            pass

    thread = threading.Thread(target=call, name="roll-call", daemon=True)
    thread.start()
    thread.join(CALL_BOUND_S)
    return outcome[0]
