"""SnapshotGuard: passes items through, hands out copies of its source's state, restores at every position."""

from __future__ import annotations

import pytest
from node_checks import CountingSource, assert_same, check_save_load_everywhere, saved_after, take

from mimo_pipes.errors import StateMismatchError
from mimo_pipes.nodes import SnapshotGuard, Windower
from mimo_pipes.testing import tail_settings


def test_restores_at_every_position():
    assert len(check_save_load_everywhere(lambda: SnapshotGuard(CountingSource(12)))) == 12


def test_passes_items_through_and_hands_out_copies():
    guard, plain = SnapshotGuard(CountingSource(12)), CountingSource(12)
    assert_same(take(guard, None), take(plain, None))
    guard = SnapshotGuard(CountingSource(12))
    take(guard, 2)
    state = guard.state_dict()
    take(guard, 3)
    assert state["source"] == {"next": 2}, "the state handed out followed the live source"


def test_refuses_another_node_s_state():
    windows = saved_after(Windower(CountingSource(12), settings=tail_settings(samples_per_rank=2, window_size=2)), 1)
    with pytest.raises(StateMismatchError, match="SnapshotGuard: the saved state is a Windower's state, not a SnapshotGuard's"):
        SnapshotGuard(CountingSource(12)).reset(windows)
