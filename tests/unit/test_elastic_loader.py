"""The library's load path on another layout, in one process (DP 1 on canonical grids of 1 and 2, as a rank of
language dp 1 + images dp 1 and of language dp 1 + images dp 2 sees them): the graph loader, balance_iterator
over a factory and the DataLoader adapter continue the global stream from a state of the other layout; a
setting that shapes the stream is refused naming it, and so is a source that cannot start elsewhere."""

from __future__ import annotations

import json

import pytest
from node_checks import take
from scenarios_exchange import PAD_VALUES
from test_plugin_dist import reorder_config, single_rank_batches

from mimo_pipes.adapters.dataloader import RankMicroBatches
from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

GRID_1 = (("language=dp=1", "images=dp=1,rank_offset=1"), RankLayout(0, 1, 1))
GRID_2 = (("language=dp=1", "images=dp=2,rank_offset=1"), RankLayout(0, 1, 2))


def graph(layout, *, seed: int = 3, across: bool = True, size: int = 96):
    components, rank = layout
    config = PipelineConfig(components=components, micro_batch_size=8, seq_length=4096, seed=seed, num_workers=1, global_batch_size=32,
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=4,
                                                  reorder_across_microbatches=across))
    return pipeline(SyntheticProcessedDataset(size, seed=3), config, rank, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)


def ids(batches) -> list[list[int]]:
    return [sorted(batch["sample_ids"]) for batch in batches]


def saved_after(layout, count: int, **settings) -> tuple[dict, list[list[int]]]:
    """The state after ``count`` micro-batches (through JSON), and the micro-batches that follow it."""
    loader = graph(layout, **settings)
    take(loader, count)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = ids(take(loader, 12 - count))
    loader.close()
    return state, rest


@pytest.mark.parametrize("count", [4, 5, 7])
def test_the_graph_loader_continues_a_state_of_another_layout(count):
    state, rest = saved_after(GRID_1, count)
    for target in (GRID_2, GRID_1):  # another layout, and the saving one (exact, node by node)
        loader = graph(target)
        loader.load_state_dict(state)
        assert loader.consumed_microbatches == count
        got = ids(take(loader, 12 - count))
        window_end = -(-count // 4) * 4  # the window the state stands in (none at a boundary)
        assert got[: window_end - count] == rest[: window_end - count]  # the saved window's micro-batches
        assert sorted(sum(got[window_end - count :], [])) == sorted(sum(rest[window_end - count :], []))  # later windows
        again = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        if target is GRID_1:
            assert got == rest
    resaved = graph(GRID_2)
    resaved.load_state_dict(state)
    before_reading = json.loads(json.dumps(resaved.state_dict()))  # a state taken before reading keeps the window's
    resaved.close()
    continued = graph(GRID_2)
    continued.load_state_dict(before_reading)
    window_end = -(-count // 4) * 4
    assert ids(take(continued, window_end - count)) == rest[: window_end - count]
    continued.close()
    assert again["consumed_microbatches"] == 12


def test_a_setting_that_shapes_the_stream_is_refused_on_another_layout():
    state, _ = saved_after(GRID_1, 5)
    with pytest.raises(StateMismatchError, match=r"^CanonicalShardReader: saved state was made with seed 3, this graph has 4: the state "
                                                 r"was saved under another layout, which it can continue only while everything that shapes "
                                                 r"the global stream is unchanged$"):
        graph(GRID_2, seed=4).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"^BalanceExchange: saved state was made with reorder across micro-batches true, this graph has false"):
        graph(GRID_2, across=False).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="dataset length 96, this graph has 104"):
        graph(GRID_2, size=104).load_state_dict(state)


def adapter(grid: int, source=None, **extra):
    settings = dict(config=reorder_config(reorder_window_size=2), layout=RankLayout(0, 1, grid), micro_batch_size=4,
                    image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=2048)
    return balance_iterator(source, **settings, **extra)


def test_balance_iterator_with_a_factory_continues_on_another_layout():
    with adapter(1, source_factory=single_rank_batches) as first:
        take(first, 3)
        state = json.loads(json.dumps(first.state_dict()))
        rest = ids(take(first, 4))
    with adapter(2, source_factory=single_rank_batches) as second:
        second.load_state_dict(state)
        assert ids(take(second, 4)) == rest


def test_a_source_that_cannot_start_elsewhere_is_refused_naming_it():
    inner = graph(GRID_1)  # a loader as the source: its state is its own layout's
    with balance_iterator(inner, config=reorder_config(reorder_window_size=2), layout=RankLayout(0, 1, 1), micro_batch_size=8,
                          image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=4096) as first:
        take(first, 3)
        state = json.loads(json.dumps(first.state_dict()))
    other = graph(GRID_2)
    with balance_iterator(other, config=reorder_config(reorder_window_size=2), layout=RankLayout(0, 1, 2), micro_batch_size=8,
                          image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=4096) as second:
        with pytest.raises(StateMismatchError, match="^GraphLoader: the state was saved under another layout, and this graph's source "
                                                     "GraphLoader cannot start at a given global micro-batch"):
            second.load_state_dict(state)


def test_the_dataloader_adapter_continues_on_another_layout():
    from torchdata.stateful_dataloader import StatefulDataLoader

    first = StatefulDataLoader(RankMicroBatches(lambda: graph(GRID_1)), batch_size=None, num_workers=0)
    iterator = iter(first)
    for _ in range(6):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))
    rest = ids(next(iterator) for _ in range(2))
    first.dataset.close()
    second = StatefulDataLoader(RankMicroBatches(lambda: graph(GRID_2)), batch_size=None, num_workers=0)
    second.load_state_dict(state)
    resumed = iter(second)
    assert ids(next(resumed) for _ in range(2)) == rest  # the rest of the saved window, as saved
    second.dataset.close()
