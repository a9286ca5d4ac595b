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

from mimo_pipes.errors import TRANSPORT, lost_peer

__all__ = ["lost_peer", "lost_peer_line"]

if TYPE_CHECKING:
    from mimo_pipes.exchange.roll_verdicts import Verdict


def lost_peer_line(command: str, rank: int, error: BaseException, verdict: Verdict | None = None) -> str | None:
    """A rank's one line when ``error`` is a lost peer (None otherwise): the library's own account of what
    failed (a PeerError's message) without the transport's text, the cause in a few words, and what the
    roll's ``verdict`` tells of the peer that is gone (None: not known)."""
    cause = lost_peer(error)
    if cause is None:
        return None
    from mimo_pipes.errors import LostPeerError, PeerError

    if isinstance(error, LostPeerError):  # the library's own line: what failed, the cause, the rank the roll named
        line = f"{command}: rank {rank}: {error}"
        if error.phrase:
            return line
    elif isinstance(error, PeerError):
        line = f"{command}: rank {rank}: {_TRANSPORT_PART.sub('', str(error))} ({cause})"
    else:
        line = f"{command}: rank {rank}: stopped: a peer rank exited or stopped answering during a collective ({cause})"
    phrase = verdict.phrase(lost_peer=True) if verdict is not None else None
    return f"{line}; {phrase}" if phrase else line


# A parenthesised part of a message that quotes the transport: "(... pair.cc:537] Read error ...)".
_TRANSPORT_PART = re.compile(rf"\s*\([^()]*?(?:{TRANSPORT.pattern})[^()]*\)", re.I)
