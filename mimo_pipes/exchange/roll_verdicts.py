"""The roll of a job's ranks, read by a rank that stops: which peer died, in words (pure; the store and the
processes are read in ``roll_store.py``).

A rank killed outright (``kill -9``, the OOM killer, a crash) says nothing, and what its peers get from the
transport names a socket. Each rank therefore signs the job's roll at start (its node, pid and start time)
and says how it ended when it ends; a rank that stops looks at the processes of its own node and reports
the ones gone without a word to the others. A peer on another node is only known dead when a rank of that
node reported it: otherwise the line says it cannot be told, never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a rank ended, as it says on the roll: finished, stopped by a signal, failed because a peer failed or
# went away, failed on an error of its own.
ENDINGS = ("done", "stopped", "peer", "error")


@dataclass(frozen=True)
class Signed:
    """A rank's process as it signed the roll: ``start`` is its start time in clock ticks since boot, so a
    pid the kernel hands to another process later is not taken for the rank."""

    rank: int
    pid: int
    start: int


def signed_text(entry: Signed) -> str:
    return f"{entry.rank}:{entry.pid}:{entry.start},"


def parse_signed(text: str) -> list[Signed]:
    """The entries of one node's roll (``rank:pid:start,`` appended by each of its ranks)."""
    entries = []
    for item in filter(None, text.split(",")):
        rank, pid, start = item.split(":")
        entries.append(Signed(int(rank), int(pid), int(start)))
    return entries


def parse_pairs(text: str) -> dict[int, str]:
    """``rank:word,`` items (how ranks ended, or the host a dead rank was seen on) by rank; the first word wins."""
    pairs: dict[int, str] = {}
    for item in filter(None, text.split(",")):
        rank, _, word = item.partition(":")
        pairs.setdefault(int(rank), word)
    return pairs


@dataclass(frozen=True)
class Verdict:
    """What a rank can tell about its peers when it stops: ``dead`` ranks (by rank, the host they were seen
    gone on, None: this rank's node), ranks that ``failed`` on an error of their own, and ``unseen`` ranks on
    other nodes of which nothing is known."""

    dead: dict[int, str | None]
    failed: tuple[int, ...] = ()
    unseen: tuple[int, ...] = ()

    def phrase(self, lost_peer: bool) -> str | None:
        """The words for the rank's line (None: nothing to add). ``lost_peer``: the rank lost a peer, so
        that a peer is gone is certain and not finding it is worth saying."""
        if self.dead:
            by_host: dict[str | None, list[int]] = {}
            for rank, host in sorted(self.dead.items()):
                by_host.setdefault(host, []).append(rank)
            died = " and ".join(f"{ranks_text(ranks)} died" + (f" on {host}" if host else "") for host, ranks in by_host.items())
            whose = "its process" if len(self.dead) == 1 else "their processes"
            return f"{died} ({whose} ended without a word: killed or crashed)"
        if self.failed:
            whose = "its line says" if len(self.failed) == 1 else "their lines say"
            return f"{ranks_text(self.failed)} failed on an error of {'its' if len(self.failed) == 1 else 'their'} own ({whose} which)"
        if lost_peer and self.unseen:
            return f"which rank is gone cannot be told from this node: none of its ranks died, and {ranks_text(self.unseen)} run on other nodes"
        return None


def judge(me: int, world_size: int, here: list[Signed], gone: set[int], ended: dict[int, str], reported: dict[int, str]) -> Verdict:
    """The verdict of rank ``me``: ``here`` are the ranks that signed on its node, ``gone`` those of them whose
    process no longer runs, ``ended`` how ranks said they ended, ``reported`` the dead ranks other nodes
    found (with their host). A rank gone without saying how it ended died."""
    dead: dict[int, str | None] = {rank: host for rank, host in reported.items() if rank != me}
    dead.update({rank: None for rank in gone if rank != me and rank not in ended})
    local = {entry.rank for entry in here}
    unseen = tuple(rank for rank in range(world_size) if rank not in local and rank not in dead and rank not in ended and rank != me)
    failed = tuple(sorted(rank for rank, how in ended.items() if how == "error" and rank != me))
    return Verdict(dead, failed, unseen)


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """``rank 2``, ``ranks 4-7``, ``ranks 0, 2, 5-6``."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
    return f"rank {parts[0]}" if len(ranks) == 1 else f"ranks {', '.join(parts)}"
