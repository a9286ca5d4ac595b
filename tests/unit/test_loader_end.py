"""Where a run ends: a loader told the consumed micro-batches its run stops at reads, processes and exchanges
nothing past the window holding the last of them, hands out the same stream up to there, and a state saved at
the end continues the same stream under a later end."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st
from node_checks import as_saved, assert_same, take

from mimo_pipes.checkpoint.resume import end_step
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

MICRO_BATCH = 4
WINDOW = 3


class ReadRecorder(SyntheticProcessedDataset):
    """The synthetic dataset, recording the global step of every row read (rows are read in canonical order)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads: list[int] = []

    def __getitem__(self, index: int) -> dict:
        self.reads.append(index)
        return super().__getitem__(index)


def tag(sample: dict) -> dict:
    sample["tagged"] = sample["sample_id"] * 2
    return sample


def graph(consumed: int = 0, end: int | None = None, *, mapped: bool = True) -> tuple[GraphLoader, ReadRecorder]:
    """One rank's graph; ``mapped``: with per-sample processing (on threads, which read ahead of the consumer)."""
    config = PipelineConfig(
        components=("language=dp=1",), micro_batch_size=MICRO_BATCH, seq_length=1600, seed=3, num_workers=2,
        processing="thread",  # where the stream ends; worker processes: tests/distributed/test_payload_dist.py
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=WINDOW),
    )
    dataset = ReadRecorder(40, seed=3, text_tokens=4, patch_dim=2)
    loader = pipeline(dataset, config, RankLayout(0, 1, 1), map_fn=tag if mapped else None, image_token_id=IMAGE_TOKEN_ID,
                      pad_values={"labels": -100}, consumed_microbatches=consumed)
    dataset.reads.clear()  # the reader's fingerprint of its first rows, read as it was built
    if end is not None:
        loader.end_at(end)
    return loader, dataset


def read_until_the_end(loader: GraphLoader) -> list[dict]:
    batches = []
    for batch in loader:
        batches.append(batch)
        assert len(batches) < 100, "the stream did not end"
    return batches


@given(window=st.integers(1, 8), first_step=st.integers(0, 60), end=st.integers(0, 80))
def test_the_end_step_is_the_end_of_the_window_holding_the_last_micro_batch(window, first_step, end):
    step = end_step(end, window, first_step)
    assert step >= first_step
    if end > first_step:
        assert step >= end and step % window == 0 and step - window < end  # the first window boundary at or past it
    else:
        assert step == first_step  # nothing left to read
    assert end_step(None, window, first_step) is None


@pytest.mark.parametrize("mapped", [True, False])
@pytest.mark.parametrize("end", [1, 4, 6])  # inside the first window, one into the second, at its end
def test_the_stream_ends_with_the_window_holding_the_last_micro_batch_and_nothing_after_it_is_read(end, mapped):
    endless, endless_rows = graph(mapped=mapped)
    reference = take(endless, 9)
    endless.close()
    ended, rows = graph(end=end, mapped=mapped)
    batches = read_until_the_end(ended)
    last_step = -(-end // WINDOW) * WINDOW
    assert [batch["step"] for batch in batches] == list(range(last_step))
    assert_same(batches, reference[:last_step])
    assert len(rows.reads) == last_step * MICRO_BATCH  # every row of the windows it hands out, and no other
    if mapped:
        assert len(endless_rows.reads) > 9 * MICRO_BATCH  # without an end, the processing threads read ahead
    ended.close()


def test_a_state_saved_at_the_end_continues_the_same_stream_under_a_later_end():
    reference_loader, _ = graph()
    reference = take(reference_loader, 9)
    reference_loader.close()
    first, _ = graph(end=4)
    assert_same(take(first, 4), reference[:4])
    state = as_saved(first.state_dict())
    first.close()
    resumed, rows = graph(end=8)
    resumed.load_state_dict(copy.deepcopy(state))
    batches = read_until_the_end(resumed)
    assert resumed.consumed_microbatches == 9  # the window holding the 8th micro-batch ends at 9
    assert_same(batches, reference[4:9])
    assert len(rows.reads) == 2 * WINDOW * MICRO_BATCH  # the window it stood in (read again), then the next
    resumed.close()


def test_a_graph_started_at_or_past_its_end_hands_out_nothing_further():
    loader, rows = graph(consumed=6, end=6)
    assert read_until_the_end(loader) == []
    assert rows.reads == []
    loader.close()


@pytest.mark.parametrize("bad", [-1, 2.0, True, "4"])
def test_an_end_that_is_not_a_count_is_refused_naming_it(bad):
    loader, _ = graph()
    with pytest.raises(ConfigError, match="end_microbatches"):
        loader.end_at(bad)
    loader.close()
