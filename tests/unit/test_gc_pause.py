"""The garbage collector paused while heavy modules load: restored as it was, and a rank's own start frozen out."""

from __future__ import annotations

import gc

import pytest

from mimo_pipes.cli.job import launcher
from mimo_pipes.observe.third_party import paused_gc


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_gc_restores_the_collector_as_it_was_even_on_error(enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(RuntimeError), paused_gc():
            assert not gc.isenabled()
            raise RuntimeError("a failing import")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_ranks_start_is_paused_until_its_graph_is_built_then_frozen(monkeypatch):
    monkeypatch.setattr(launcher, "_start_paused", False)
    assert gc.isenabled()
    launcher.rank_started()  # a rank's body in a caller's process: nothing changes
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        launcher.pause_rank_start()
        assert not gc.isenabled()
        kept = [[index] for index in range(10)]  # built during the start: tracked by the collector
        launcher.rank_started()
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept) and gc.is_tracked(kept[0])
        launcher.rank_started()  # once only
        assert gc.isenabled()
    finally:
        gc.enable()
