"""A collective of the library that loses a peer ends in one line naming what was going on and which rank is gone
(the job's roll stands in for a real one here; tests/launch/test_save_rank_lost.py and test_rank_killed.py lose
real ranks)."""

from __future__ import annotations

import pytest

from mimo_pipes.cli.job.peer_loss import lost_peer_line
from mimo_pipes.errors import LostPeerError, PeerError, SampleError
from mimo_pipes.exchange import lost_peers
from mimo_pipes.exchange.roll_verdicts import Verdict

GLOO_CLOSED = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:41197"


@pytest.fixture
def roll(monkeypatch):
    """The roll's verdict a rank gets (None: no roll signed), and what the rank said of its own ending."""
    said: dict = {"verdict": None}

    def call_roll(ending, read, roll=None):
        said["ending"], said["read"] = ending, read
        return said["verdict"]

    monkeypatch.setattr("mimo_pipes.exchange.roll_store.call_roll", call_roll)
    return said


def raised(what: str, error: BaseException) -> BaseException:
    with pytest.raises(BaseException) as caught, lost_peers.collective(what):
        raise error
    return caught.value


def test_a_peer_lost_in_a_collective_is_named_in_one_line(roll):
    roll["verdict"] = Verdict(dead={2: None})
    error = raised("the all-gather of window costs", RuntimeError(GLOO_CLOSED))
    assert isinstance(error, LostPeerError) and error.rank == 2
    assert str(error) == ("the all-gather of window costs failed: a peer rank exited or stopped answering (connection closed by peer); "
                          "rank 2 died (its process ended without a word: killed or crashed)")
    assert (roll["ending"], roll["read"]) == ("peer", True)  # said on the roll, so that its peers do not take it for dead
    # The CLI's line is the library's, the rank named once.
    line = lost_peer_line("mimo-pipes run", 1, error, Verdict(dead={2: None}))
    assert line == f"mimo-pipes run: rank 1: {error}" and line.count("rank 2 died") == 1


def test_without_a_roll_the_line_says_what_failed_and_the_cause_only(roll):
    error = raised("the save", RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms"))
    assert isinstance(error, LostPeerError) and error.rank is None
    assert str(error) == "the save failed: a peer rank exited or stopped answering (timed out waiting for a peer)"
    # the CLI reads the roll again on its way out: what it finds is added once
    line = lost_peer_line("mimo-pipes run", 0, error, Verdict(dead={3: None}))
    assert line == f"mimo-pipes run: rank 0: {error}; rank 3 died (its process ended without a word: killed or crashed)"


def test_other_failures_keep_their_text_and_the_librarys_own_errors_pass(roll):
    other = raised("the all_to_all of packed samples", RuntimeError("CUDA out of memory"))
    assert type(other) is PeerError and "CUDA out of memory" in str(other) and "ending" not in roll  # not a lost peer: the roll is left alone
    own = SampleError(4, "is missing", field="labels")
    assert raised("the all-gather of window costs", own) is own
    peer = PeerError(3, "its data ended")
    assert raised("the all-gather of window costs", peer) is peer


def test_a_lost_peer_error_survives_a_hop_through_a_worker(roll):
    roll["verdict"] = Verdict(dead={0: None})
    error = raised("the save", RuntimeError(GLOO_CLOSED))
    rebuilt = type(error)(str(error))  # as pickling and torch's ExceptionWrapper rebuild it
    assert str(rebuilt) == str(error) and isinstance(rebuilt, PeerError)
