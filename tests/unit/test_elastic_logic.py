"""Elastic resume as pure logic (no ranks): for random pairs of layouts with the same global micro-batch size,
the reader, the replacement of bad rows and the window position give the same global samples per global
micro-batch after the resume point as the uninterrupted run (per window where samples move between
micro-batches, and the saved window's own micro-batches exactly); and the planner that keeps a saved
composition balances it over any grid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_composition, balance_composition_two_level, balance_window
from mimo_pipes.checkpoint.resume import resume_point
from mimo_pipes.data.bad_rows.skipping import SkipBadRows
from mimo_pipes.errors import SampleError
from mimo_pipes.exchange.plan import plan_exchange, validate_assignment
from mimo_pipes.parallel.sharding import shard_indices
from mimo_pipes.parallel.topology import canonical_slot_count, owned_positions
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP

# (language dp, encoder dp): encoder dp divides language dp.
LAYOUTS = [(1, 1), (2, 1), (2, 2), (3, 1), (3, 3), (4, 1), (4, 2), (4, 4), (6, 2), (6, 3)]
SEED = 7


class FailOn:
    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __call__(self, row: dict) -> dict:
        if row[SAMPLE_ID] in self.bad:
            raise SampleError(row[SAMPLE_ID], "bad row")
        return row


def global_rows(step: int, dp: int, grid: int, size: int, batch: int, skip: SkipBadRows) -> list[int]:
    """What a module of DP size ``dp`` (canonical grid ``grid``) holds at ``step``, by global position: each
    rank reads its own positions (scalable DP) and replaces its bad rows."""
    rows = []
    for rank in range(dp):
        positions = owned_positions(rank, dp, batch)
        for position, index in zip(positions, shard_indices(step, rank, dp, size, batch, SEED, True)):
            row = {SAMPLE_ID: int(index), STEP: step, SLOT: position // (batch // grid)}
            rows.append(skip(row)[SAMPLE_ID])
    return rows


def window_sets(costs: list[list[int]], rows: list[list[int]], assignment) -> list[list[int]]:
    """The samples of each output micro-batch of a window's assignment."""
    flat = [row for step_rows in rows for row in step_rows]
    return [sorted(flat[i] for slot in slots for i in slot) for slots in assignment]


@st.composite
def cases(draw):
    batch = draw(st.sampled_from([4, 6, 8, 12]))
    fitting = [layout for layout in LAYOUTS if batch % canonical_slot_count(layout) == 0]
    saved, resumed = draw(st.sampled_from(fitting)), draw(st.sampled_from(fitting))
    window = draw(st.integers(1, 4))
    consumed = draw(st.integers(0, 3 * window - 1))
    size = batch * draw(st.integers(2, 5))
    bad = set(draw(st.lists(st.integers(0, size - 1), max_size=size // 4)))
    costs = draw(st.lists(st.integers(0, 1000), min_size=size, max_size=size))
    return batch, saved, resumed, window, draw(st.booleans()), consumed, size, bad, costs


@settings(max_examples=30, deadline=None)  # a whole skip-replay and elastic resume each: ~70 ms
@given(cases())
def test_the_global_stream_after_the_resume_point_does_not_depend_on_the_layout(case):
    batch, saved, resumed, window, across, consumed, size, bad, costs = case
    dataset = [{"row": i} for i in range(size)]
    skip = SkipBadRows(FailOn(bad), dataset, micro_batch_size=batch, seed=SEED, dataloader_type="cyclic", max_tries=size * 8)
    old_grid, new_grid = canonical_slot_count(saved), canonical_slot_count(resumed)
    point = resume_point(consumed, window)
    assert point.first_step == consumed - consumed % window and point.skip_first == consumed % window
    steps = point.first_step + 2 * window
    # Reader and replacements: every module of both layouts holds the same rows at every global position.
    rows = {}
    for step in range(steps):
        held = {tuple(global_rows(step, dp, grid, size, batch, skip)) for layout, grid in ((saved, old_grid), (resumed, new_grid)) for dp in layout}
        assert len(held) == 1, step
        rows[step] = list(held.pop())
        assert not set(rows[step]) & bad
    # Windows: the uninterrupted run plans each on the saved layout's grid; the resumed one keeps the saved
    # composition of the window it restores inside, and plans the later ones on its own grid.
    for first in range(point.first_step, steps, window):
        window_rows = [rows[step] for step in range(first, first + window)]
        window_costs = [[costs[row] for row in step_rows] for step_rows in window_rows]
        old = balance_window(window_costs, old_grid, across_microbatches=across)
        before = window_sets(window_costs, window_rows, old)
        if first == point.first_step:
            composition = [sorted(i for slot in slots for i in slot) for slots in old]
            new = balance_composition(window_costs, composition, new_grid) if across else balance_window(window_costs, new_grid)
        else:
            new = balance_window(window_costs, new_grid, across_microbatches=across)
        validate_assignment(new, new_grid, batch)
        after = window_sets(window_costs, window_rows, new)
        if first == point.first_step or not across:
            assert after == before  # micro-batch by micro-batch
        else:
            assert sorted(sum(after, [])) == sorted(sum(before, []))  # the window as a whole


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_a_kept_composition_is_balanced_over_any_grid(data):
    grid = data.draw(st.sampled_from([1, 2, 3, 4, 6]))
    batch = grid * data.draw(st.integers(1, 4))
    count = data.draw(st.integers(1, 4))
    costs = [[data.draw(st.integers(0, 500)) for _ in range(batch)] for _ in range(count)]
    order = data.draw(st.permutations(range(count * batch)))
    composition = [sorted(order[m * batch : (m + 1) * batch]) for m in range(count)]
    assignment = balance_composition(costs, composition, grid)
    assert validate_assignment(assignment, grid, batch) == count
    assert [sorted(i for slot in slots for i in slot) for slots in assignment] == composition
    assert balance_composition(costs, composition, grid) == assignment  # a pure function of its inputs
    for dp in (d for d in range(1, grid + 1) if grid % d == 0):
        plan_exchange(assignment, 0, dp, grid, batch)  # a plan every rank can follow
    flat = np.array(costs).reshape(-1)
    for m, slots in enumerate(assignment):  # as good as balancing that micro-batch alone
        alone = balance_window([[int(flat[i]) for i in composition[m]]], grid)[0]
        heaviest = max(sum(int(flat[i]) for i in slot) for slot in slots)
        assert heaviest == max(sum(int(flat[composition[m][j]]) for j in slot) for slot in alone)
    if grid > 1:
        groups = max(g for g in range(1, grid) if grid % g == 0)
        two = balance_composition_two_level(costs, costs, composition, groups, grid)
        assert [sorted(i for slot in slots for i in slot) for slots in two] == composition
        validate_assignment(two, grid, batch)
