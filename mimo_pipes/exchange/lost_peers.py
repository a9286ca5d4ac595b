"""A collective the library issues that loses a peer: one line naming what was going on and which rank is gone.

When one rank of a job dies (killed, out of memory, ``os._exit``), every rank in a collective with it fails with
the transport's text (Gloo's ``pair.cc:598] Connection closed by peer [127.0.0.1]:41197``, a timeout, NCCL's
abort), which names a socket, not the rank. Every collective of the library (the exchange's all-gathers and
all_to_all, the agreement on failed rows, a save's agreements, the check that every rank restored one position)
runs inside :func:`collective`, which turns that text into a :class:`~mimo_pipes.errors.LostPeerError`: what was
going on, the transport's cause in a few words, and the rank that died as the job's roll tells it
(``roll_store.py``; signed where the job's store outlives its ranks: under torchrun or ``mimo-pipes run``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mimo_pipes.errors import LostPeerError, PeerError, lost_peer


def peer_lost(what: str, error: BaseException) -> PeerError:
    """The error a rank raises when ``what`` (a collective) failed with ``error``: a LostPeerError naming the
    rank the roll finds gone when the transport lost a peer (this rank then says on the roll that it ends for a
    peer, so that the others do not take it for dead too); else a PeerError quoting ``error``."""
    cause = lost_peer(error)
    if cause is None:
        return PeerError(None, f"{what} failed ({error}); a peer rank may have exited or stalled past the timeout")
    from mimo_pipes.exchange.roll_store import call_roll

    verdict = call_roll("peer", read=True)
    phrase = verdict.phrase(lost_peer=True) if verdict is not None else None
    dead = sorted(verdict.dead) if verdict is not None else []
    return LostPeerError(what, cause, phrase, dead[0] if len(dead) == 1 else None)


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """Runs one collective of the library: a peer lost on the way (or one silent past the group's timeout) is
    raised as :func:`peer_lost`'s error; the library's own errors pass as they are."""
    try:
        yield
    except (PeerError, MemoryError):
        raise
    except RuntimeError as error:
        raise peer_lost(what, error) from error
