"""MicroBatchAssembler: collated windows (from a WindowCollator) split into micro-batches, restore at every
position (mid-window included), a start from a consumed count, and what its state is valid for."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from node_checks import assert_same, check_refused, check_save_load_everywhere, saved_after, take, tiny_samples
from torchdata.nodes import IterableWrapper

from mimo_pipes.checkpoint.resume import resume_point
from mimo_pipes.nodes import MicroBatchAssembler, WindowCollator, Windower
from mimo_pipes.samples.collate import Collator, collate_microbatch
from mimo_pipes.samples.sample import Window
from mimo_pipes.testing import tail_settings


def windower(per_microbatch=3, window_size=3, steps=7, first_step=0) -> Windower:
    return Windower(tiny_samples(per_microbatch, steps, first_step), settings=tail_settings(samples_per_rank=per_microbatch, window_size=window_size))


PADDED = Collator(1600, {"labels": -100, "input_ids": 7})


def assembler(per_microbatch=3, window_size=3, steps=7, consumed=0, collator=PADDED) -> MicroBatchAssembler:
    """Over the windows a graph that consumed ``consumed`` micro-batches reads (from that window's start)."""
    settings = tail_settings(samples_per_rank=per_microbatch, window_size=window_size, collator=collator)
    point = resume_point(consumed, window_size)  # what the loader tells every node
    collated = WindowCollator(windower(per_microbatch, window_size, steps, point.first_step), settings=settings)
    node = MicroBatchAssembler(collated, settings=settings)
    node.start_at(point)
    return node


def test_restores_at_every_position():
    batches = check_save_load_everywhere(assembler)
    assert [batch["step"] for batch in batches] == list(range(7))
    assert all(batch["input_ids"].shape == (3, 1600) for batch in batches)


def test_micro_batches_are_the_windows_collated():
    windows = take(windower(), None)
    expected = [PADDED.microbatch(mb, w.first_step + m) for w in windows for m, mb in enumerate(w.microbatches)]
    assert_same(take(assembler(), None), expected)


def test_collated_windows_pass_through():
    batch = collate_microbatch(take(windower(), 1)[0].microbatches[0], pad_length=None)
    node = MicroBatchAssembler(IterableWrapper([Window(0, [batch], collated=True)]), settings=tail_settings(samples_per_rank=3))
    assert next(node) is batch


def test_an_uncollated_window_is_refused():
    node = MicroBatchAssembler(windower(), settings=tail_settings(samples_per_rank=3, window_size=3))
    with pytest.raises(TypeError, match="the window at step 0 is not collated: a WindowCollator goes before the assembler"):
        next(node)


@settings(max_examples=30, deadline=None)
@given(per_microbatch=st.integers(1, 3), window_size=st.integers(1, 4), steps=st.integers(1, 7), data=st.data())
def test_a_start_from_a_consumed_count_is_a_restore(per_microbatch, window_size, steps, data):
    def make():
        return assembler(per_microbatch, window_size, steps, collator=Collator(None))

    reference = take(make(), None)
    consumed = data.draw(st.integers(0, steps - 1), label="consumed")
    restored = make()  # the restore at the drawn position (every position of one shape: test_restores_at_every_position)
    restored.reset(saved_after(make(), consumed))
    assert_same(take(restored, None), reference[consumed:])
    from_count = assembler(per_microbatch, window_size, steps, consumed, collator=Collator(None))
    assert from_count.skip_first == consumed % window_size
    assert_same(take(from_count, None), reference[consumed:])


@pytest.mark.parametrize(
    "setting, collator, saved, now",
    [
        ("collation pad length", Collator(None, PADDED.pad_values), 1600, None),
        ("collation pad values", Collator(1600, {"labels": -1}), {"labels": -100, "input_ids": 7}, {"labels": -1}),
    ],
)
def test_refuses_a_state_made_for_another_collation(setting, collator, saved, now):
    check_refused(assembler(collator=collator).reset, saved_after(assembler(), 4), "MicroBatchAssembler", setting, saved, now)


def test_default_collation_pads_to_the_longest():
    batch = next(assembler(collator=None))
    lengths = batch["attention_mask"].sum(dim=1)
    assert batch["input_ids"].shape[1] == int(lengths.max()) and batch["labels"].dtype == torch.int64
