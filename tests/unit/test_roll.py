"""The job's roll: which peer died, told from the ranks of a node and what the other nodes reported (pure), and
the roll kept on a real store (an in-process TCPStore: two nodes simulated by their identities)."""

from __future__ import annotations

import os

import pytest

from mimo_pipes.exchange import roll_store
from mimo_pipes.exchange.roll_store import Roll, call_roll, process_start, sign
from mimo_pipes.exchange.roll_verdicts import Signed, Verdict, judge, parse_pairs, parse_signed, ranks_text, signed_text

FOUR = [Signed(rank, 100 + rank, 7) for rank in range(4)]


def test_a_rank_gone_without_a_word_died_and_one_that_said_how_it_ended_did_not():
    verdict = judge(0, 4, FOUR, gone={2, 3}, ended={3: "peer"}, reported={})
    assert verdict == Verdict({2: None})
    assert verdict.phrase(lost_peer=True) == "rank 2 died (its process ended without a word: killed or crashed)"
    assert verdict.phrase(lost_peer=False) == verdict.phrase(lost_peer=True)  # a stop names it too


def test_ranks_of_other_nodes_are_named_only_when_their_node_reported_them():
    here = FOUR[:2]  # ranks 0-1 on this node, 2-5 elsewhere
    unknown = judge(0, 6, here, gone=set(), ended={}, reported={})
    assert unknown == Verdict({}, (), (2, 3, 4, 5))
    assert unknown.phrase(lost_peer=True) == ("which rank is gone cannot be told from this node: none of its ranks died, "
                                             "and ranks 2-5 run on other nodes")
    assert unknown.phrase(lost_peer=False) is None  # a stop with nobody missing (a scheduler's SIGTERM): nothing to add
    reported = judge(0, 6, here, gone=set(), ended={3: "stopped"}, reported={4: "node-b"})
    assert reported == Verdict({4: "node-b"}, (), (2, 5))
    assert reported.phrase(lost_peer=True) == "rank 4 died on node-b (its process ended without a word: killed or crashed)"


def test_several_dead_ranks_and_ranks_that_failed_on_their_own():
    both = judge(1, 6, FOUR, gone={0, 2}, ended={}, reported={5: "node-b"})
    assert both.phrase(lost_peer=True) == "ranks 0, 2 died and rank 5 died on node-b (their processes ended without a word: killed or crashed)"
    failed = judge(0, 4, FOUR, gone={3}, ended={3: "error", 1: "peer"}, reported={})
    assert failed == Verdict({}, (3,), ())
    assert failed.phrase(lost_peer=False) == "rank 3 failed on an error of its own (its line says which)"
    assert judge(0, 4, FOUR, gone=set(), ended={}, reported={}).phrase(lost_peer=True) is None


def test_the_roll_texts_round_trip():
    assert parse_signed("".join(map(signed_text, FOUR))) == FOUR
    assert parse_pairs("3:peer,1:error,3:done,") == {3: "peer", 1: "error"}  # the first word wins
    assert [ranks_text(r) for r in ([2], [4, 5, 6, 7], [0, 2, 5, 6])] == ["rank 2", "ranks 4-7", "ranks 0, 2, 5-6"]


def test_a_process_is_known_by_its_pid_and_start_time():
    start = process_start(os.getpid())
    assert start is not None and start > 0
    assert process_start(2**22 + 12345) is None  # beyond pid_max: no such process


@pytest.fixture
def store():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server
    del server


def _signed(monkeypatch, store, rank: int, world_size: int, node: str) -> Roll:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setattr(roll_store, "node_identity", lambda: node)
    roll = sign(rank, world_size)
    assert roll is not None
    return roll


def test_the_roll_on_a_store_names_the_dead_rank_across_nodes(monkeypatch, store):
    """Node a holds ranks 0-1, node b ranks 2-3, all signed by this process; rank 3's entry is signed by hand
    with a start time this pid does not have (as if the pid had been reused: that process is gone)."""
    monkeypatch.setattr(roll_store, "REMOTE_WAIT_S", 0.5)
    rolls = [_signed(monkeypatch, store, rank, 4, "a|boot|ns" if rank < 2 else "b|boot|ns") for rank in range(3)]
    rolls[2].store.append("node/b|boot|ns", signed_text(Signed(3, os.getpid(), process_start(os.getpid()) + 1)))
    assert call_roll("peer", read=True, roll=rolls[0]) == Verdict({}, (), (2, 3))  # node b has not reported yet
    assert call_roll("stopped", read=True, roll=rolls[2]) == Verdict({3: None}, (), (1,))  # sees rank 3 gone, reports it
    told = call_roll("peer", read=True, roll=rolls[1])
    assert told == Verdict({3: "b"})
    assert told.phrase(lost_peer=True) == "rank 3 died on b (its process ended without a word: killed or crashed)"
    assert parse_pairs(rolls[1].read("ended")) == {0: "peer", 2: "stopped", 1: "peer"}


def test_nothing_is_signed_where_the_store_does_not_outlive_the_ranks(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert sign(0, 4) is None
