"""The analyze replay's pure arithmetic: windows cut where the graph's Windower cuts them, and balancing
conserves every window's samples."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper

from mimo_pipes.analysis.replay import Planner, Schedule, critical_path_bound, critical_path_bounds, rank_loads, replay, spread_and_path
from mimo_pipes.checkpoint.resume import resume_point
from mimo_pipes.nodes import Windower
from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.samples.sample import STEP
from mimo_pipes.testing import tail_settings


@st.composite
def schedules(draw):
    grid = draw(st.sampled_from([1, 2, 4]))
    batch = grid * draw(st.integers(1, 3))
    size = batch * draw(st.integers(1, 6)) + draw(st.integers(0, batch - 1))
    return Schedule(size, batch, grid, draw(st.integers(0, 5)), draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(1, 5), st.integers(0, 12), st.integers(1, 14))
def test_windows_are_the_windowers(schedule, window, start, length):
    stop = start + length
    if not schedule.cyclic and start >= schedule.per_epoch:
        return
    first = resume_point(start, window).first_step
    last_step = stop + window if schedule.cyclic else schedule.per_epoch  # a cyclic reader never ends
    windower = Windower(IterableWrapper([{STEP: s} for s in range(first, last_step)]), settings=tail_settings(samples_per_rank=1, window_size=window))
    expected = []
    for cut in windower:
        if cut.first_step >= schedule.end(stop):
            break
        expected.append((cut.first_step, cut.first_step + len(cut.microbatches)))
    assert list(schedule.windows(start, stop, window)) == expected


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(1, 4), st.booleans(), st.integers(0, 6), st.integers(1, 9), st.data())
def test_replay_reads_the_canonical_rows_and_conserves_each_window(schedule, window, across, start, length, data):
    if not schedule.cyclic and start >= schedule.per_epoch:
        return
    costs = np.array(data.draw(st.lists(st.integers(0, 2000), min_size=schedule.dataset_size, max_size=schedule.dataset_size)), dtype=np.int64)
    stop = start + length
    result = replay(schedule, Planner(costs), start=start, stop=stop, reorder=True, window_size=window, across_microbatches=across)
    assert result.steps.tolist() == list(range(start, schedule.end(stop)))
    for row, step in zip(result.before, result.steps.tolist()):
        assert row.tolist() == global_microbatch_indices(step, schedule.dataset_size, schedule.micro_batch_size, schedule.seed, schedule.cyclic).tolist()
    for first, last in schedule.windows(start, stop, window):
        inside = (result.steps >= first) & (result.steps < last)
        if across and inside.sum() < last - first:
            continue  # a window cut by start/stop: its samples may sit in micro-batches not consumed
        assert sorted(result.after[inside].ravel().tolist()) == sorted(result.before[inside].ravel().tolist())
        if not across:  # samples stay in their micro-batch
            for i in np.flatnonzero(inside):
                assert sorted(result.after[i].tolist()) == sorted(result.before[i].tolist())
    off = replay(schedule, Planner(costs), start=start, stop=stop, reorder=False, window_size=window, across_microbatches=across)
    assert np.array_equal(off.after, off.before)
    for dp in {1, schedule.grid_size}:
        spread_on, path_on = spread_and_path(rank_loads(result.after, costs, dp))
        spread_off, path_off = spread_and_path(rank_loads(off.before, costs, dp))
        assert (spread_on == spread_off == 0.0) if dp == 1 else spread_on >= 0
        if not across and window == 1:
            assert path_on <= path_off  # balancing each micro-batch never makes its heaviest rank heavier


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(1, 4), st.booleans(), st.integers(0, 6), st.integers(1, 9), st.integers(0, 3000), st.data())
def test_critical_path_bounds_hold_for_any_balancing_with_a_floor(schedule, window, across, start, length, floor, data):
    """Each bound (per step, or per whole window when samples may move) is at most the heaviest floored rank
    load of what the planner and the readers' shards give over the same steps; the total is their sum."""
    if not schedule.cyclic and start >= schedule.per_epoch:
        return
    costs = np.array(data.draw(st.lists(st.integers(0, 2000), min_size=schedule.dataset_size, max_size=schedule.dataset_size)), dtype=np.int64)
    stop, dp = start + length, schedule.grid_size
    bounds = critical_path_bounds(schedule, costs, dp, start=start, stop=stop, window_size=window, across_microbatches=across, floor=floor)
    total = critical_path_bound(schedule, costs, dp, start=start, stop=stop, window_size=window, across_microbatches=across, floor=floor)
    if bounds is None:
        assert across and total is None
        return
    assert total == sum(bound for _, bound in bounds)
    result = replay(schedule, Planner(costs, floor), start=start, stop=stop, reorder=True, window_size=window, across_microbatches=across)
    for rows in (result.after, result.before):
        heaviest = np.maximum(rank_loads(rows, costs, dp), floor).max(axis=1)
        covered = 0
        for last, bound in bounds:
            through = int(np.searchsorted(result.steps, last, side="right"))
            assert bound <= int(heaviest[covered:through].sum())
            covered = through
        assert covered == len(result.steps)
