"""A rank that lost a peer: the transport's own text (Gloo's ``pair.cc:537] Read error ... Connection reset by
peer``, a timeout, NCCL's abort) turned into one phrase for the rank's one line.

When one rank of a job dies (killed, out of memory), every rank in a collective with it fails with the
transport's text, which names a socket, not the rank. The others say what they were doing and that they lost
a peer, the transport's cause in a few words, and which rank died as the job's roll tells it
(``exchange/roll_verdicts.py``; our launcher, which sees which child ended by a signal, names it too).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mimo_pipes.exchange.roll_verdicts import Verdict

# The transport's causes, in the words a rank's line gives them (first match wins).
_CAUSES = (
    (re.compile(r"connection reset by peer", re.I), "connection reset by peer"),
    (re.compile(r"connection closed by peer|socket closed|end of file|EOF", re.I), "connection closed by peer"),
    (re.compile(r"broken pipe", re.I), "broken pipe"),
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"NCCL communicator was aborted|remote process exited|NCCL error", re.I), "NCCL communicator aborted"),
    (re.compile(r"timed out|timeout", re.I), "timed out waiting for a peer"),  # last: the library's own messages say "timeout"
)
# Text that only a transport writes: a file of Gloo or NCCL, or torch's wrapping of their failures.
_TRANSPORT = re.compile(r"gloo|pair\.cc|\.cc:\d+|NCCL|ProcessGroup|c10d|Connection reset|Connection closed|Broken pipe", re.I)


def lost_peer(error: BaseException) -> str | None:
    """The cause in a few words when ``error`` (or one it was raised from) is a transport's failure to reach a
    peer; None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if _TRANSPORT.search(text):
            for pattern, cause in _CAUSES:
                if pattern.search(text):
                    return cause
        current = current.__cause__ or current.__context__
    return None


def lost_peer_line(command: str, rank: int, error: BaseException, verdict: Verdict | None = None) -> str | None:
    """A rank's one line when ``error`` is a lost peer (None otherwise): the library's own account of what
    failed (a PeerError's message) without the transport's text, the cause in a few words, and what the
    roll's ``verdict`` tells of the peer that is gone (None: not known)."""
    cause = lost_peer(error)
    if cause is None:
        return None
    from mimo_pipes.errors import PeerError

    if isinstance(error, PeerError):
        line = f"{command}: rank {rank}: {_TRANSPORT_PART.sub('', str(error))} ({cause})"
    else:
        line = f"{command}: rank {rank}: stopped: a peer rank exited or stopped answering during a collective ({cause})"
    phrase = verdict.phrase(lost_peer=True) if verdict is not None else None
    return f"{line}; {phrase}" if phrase else line


# A parenthesised part of a message that quotes the transport: "(... pair.cc:537] Read error ...)".
_TRANSPORT_PART = re.compile(r"\s*\([^()]*?(?:gloo|pair\.cc|\.cc:\d+|NCCL|ProcessGroup|c10d|Connection reset|Connection closed|Broken pipe)[^()]*\)", re.I)
