"""analyze's replay reads a bad row as the run's SkipBadRows replaces it: the next good row of the global
order, on any data size, micro-batch size, seed, shuffling and set of bad rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.analysis.replay import Schedule
from mimo_pipes.data.bad_rows.skipping import REPLACED_ROWS, SkipBadRows
from mimo_pipes.errors import SampleError
from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 12), st.integers(1, 6), st.integers(0, 9), st.booleans(), st.data())
def test_the_replay_replaces_bad_rows_as_the_graph_does(batches, batch, seed, cyclic, data):
    size = batches * batch + data.draw(st.integers(0, batch - 1))
    bad = data.draw(st.sets(st.integers(0, size - 1), max_size=size - 1))
    rows = [{"row": i} for i in range(size)]

    def process(row: dict) -> dict:
        if row[SAMPLE_ID] in bad:
            raise SampleError(row[SAMPLE_ID], f"dataset row {row[SAMPLE_ID]}: bad row {row[SAMPLE_ID]}")
        return dict(row)

    skipper = SkipBadRows(process, rows, micro_batch_size=batch, seed=seed, dataloader_type="cyclic" if cyclic else "single")
    schedule = Schedule(size, batch, 1, seed, cyclic, {row: f"bad row {row}" for row in bad})
    steps = range(3 * batches if cyclic else batches)
    try:
        replayed = schedule.rows(steps)
    except SampleError as error:
        # No good row within reach (every row an epoch reads is bad, or too many in a row): the graph fails alike.
        with pytest.raises(SampleError) as raised:
            for step in steps:
                for position, index in enumerate(global_microbatch_indices(step, size, batch, seed, cyclic).tolist()):
                    skipper({SAMPLE_ID: index, STEP: step, SLOT: position, "row": index})
        assert str(raised.value) == str(error)
        return
    for i, step in enumerate(steps):
        read = global_microbatch_indices(step, size, batch, seed, cyclic)
        skipped = schedule.replaced_rows(step)
        for position, index in enumerate(read.tolist()):
            sample = skipper({SAMPLE_ID: index, STEP: step, SLOT: position, "row": index})
            assert replayed[i, position] == sample[SAMPLE_ID]
            assert skipped.get(position, []) == sample[REPLACED_ROWS]
    assert not set(np.unique(replayed).tolist()) & bad
