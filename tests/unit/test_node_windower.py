"""Windower: windows aligned to multiples of W of the global step, restore at every position, validity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from node_checks import check_refused, check_save_load_everywhere, saved_after, take, tiny_samples
from torchdata.nodes import IterableWrapper

from mimo_pipes.nodes import Windower
from mimo_pipes.samples.sample import SAMPLE_ID, STEP
from mimo_pipes.testing import tail_settings


def windower(per_microbatch=3, window_size=3, steps=7, first_step=0) -> Windower:
    return Windower(tiny_samples(per_microbatch, steps, first_step), settings=tail_settings(samples_per_rank=per_microbatch, window_size=window_size))


def test_restores_at_every_position():
    windows = check_save_load_everywhere(windower)
    assert [(w.first_step, len(w.microbatches)) for w in windows] == [(0, 3), (3, 3), (6, 1)]


@settings(max_examples=30, deadline=None)
@given(per_microbatch=st.integers(1, 3), window_size=st.integers(1, 4), steps=st.integers(1, 7), data=st.data())
def test_windows_cover_the_steps_aligned_to_w(per_microbatch, window_size, steps, data):
    start = data.draw(st.integers(0, steps - 1), label="start_step")
    windows = check_save_load_everywhere(lambda: windower(per_microbatch, window_size, steps, start))
    covered = []
    for window in windows:
        window_steps = [mb[0][STEP] for mb in window.microbatches]
        assert window_steps == list(range(window.first_step, window.first_step + len(window_steps)))
        assert len({step // window_size for step in window_steps}) == 1, f"window {window_steps} crosses a multiple of W"
        assert all(len(mb) == per_microbatch and {s[STEP] for s in mb} == {mb[0][STEP]} for mb in window.microbatches)
        covered += window_steps
    assert covered == list(range(start, steps))
    assert len(windows) == len({step // window_size for step in covered})


def test_refuses_a_source_that_breaks_micro_batches():
    short = Windower(IterableWrapper([{SAMPLE_ID: 0, STEP: 0}]), settings=tail_settings(samples_per_rank=2))
    with pytest.raises(RuntimeError, match="ended inside micro-batch 0"):
        next(short)
    mixed = Windower(IterableWrapper([{SAMPLE_ID: 0, STEP: 0}, {SAMPLE_ID: 1, STEP: 1}]), settings=tail_settings(samples_per_rank=2))
    with pytest.raises(RuntimeError, match="got a sample of step 1"):
        next(mixed)
    with pytest.raises(ValueError, match=">= 1"):
        windower(window_size=0)


@pytest.mark.parametrize(
    "setting, overrides, saved, now",
    [("micro-batch size per rank", dict(per_microbatch=2), 3, 2), ("window size", dict(window_size=2), 3, 2)],
)
def test_refuses_a_state_made_for_other_settings(setting, overrides, saved, now):
    node = windower(**overrides)
    node.source = tiny_samples(3, 7)  # the same reader: only the Windower's own setting differs
    check_refused(node.reset, saved_after(windower(), 1), "Windower", setting, saved, now)


def test_items_are_windows_of_samples():
    first = take(windower(), 1)[0]
    assert [[s[SAMPLE_ID] for s in mb] for mb in first.microbatches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
