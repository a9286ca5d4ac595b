"""``iter()`` never moves a loader: a restored position survives every later ``iter()``, and an ``iter()`` after
micro-batches were taken continues where the loader stands, for a GraphLoader, ``balanced_loader``,
``balance_iterator`` (over a factory, a stateful source or a plain iterator) and the DataLoader adapter (under
torch's DataLoader and torchdata's StatefulDataLoader). torchdata's Loader restarts a restored loader at step 0
on a second ``iter()``; every rank agrees, so no check would catch it."""

from __future__ import annotations

import json

import pytest
from node_checks import take
from scenarios_exchange import PAD_VALUES
from test_elastic_loader import GRID_1, GRID_2, graph
from test_plugin_dist import single_rank_batches, wrap_single
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from mimo_pipes.adapters.dataloader import RankMicroBatches
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.existing_pipeline import example_samples
from mimo_pipes_recipes.vlm_sft import pipeline


def ids(batches) -> list[list[int]]:
    return [sorted(batch["sample_ids"]) for batch in batches]


def steps(batches) -> list[int]:
    return [batch["step"] for batch in batches]


def plugged(module: str = "language"):
    """balanced_loader over a user's nodes (with a ParallelMapper), windows of 2."""
    reorder = ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2)
    layout = RankLayout(0, 1, 1, module=module)
    node = example_samples(SyntheticProcessedDataset(64), micro_batch_size=8, layout=layout, seed=0, map_fn=lambda sample: sample)
    return balanced_loader(node, reorder=reorder, layout=layout, micro_batch_size=8, seq_length=2048,
                           image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)


def stateful_source():
    return wrap_single(StatefulDataLoader(_Steps(), batch_size=None, num_workers=0))


def saved_and_rest(make, count: int, rest: int):
    """The state after ``count`` items of a fresh loader (through JSON), and the ``rest`` items after it."""
    loader = make()
    take(loader, count)
    state = json.loads(json.dumps(loader.state_dict()))
    after = ids(take(loader, rest))
    loader.close()
    return state, after


def restored_and_rest(make, count: int, rest: int):
    """A new loader restored to the state after ``count`` items of another, and the ``rest`` items after it."""
    state, after = saved_and_rest(make, count, rest)
    restored = make()
    restored.load_state_dict(state)
    return restored, after


MAKERS = {
    "graph": lambda: graph(GRID_1),
    "graph-window-3": lambda: graph(GRID_1, across=False, seed=11),
    "balance_iterator-factory": lambda: wrap_single(source_factory=single_rank_batches),
    "balance_iterator-stateful": stateful_source,
    "balanced_loader": plugged,
}


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("count", [3, 5])
def test_a_second_iter_after_a_restore_resumes_there(name, count):
    make = MAKERS[name]
    restored, rest = restored_and_rest(make, count, 4)
    first = iter(restored)
    again = iter(restored)  # the common pattern: it = iter(loader), then a for loop over the loader
    assert ids(take(again, 4)) == rest
    assert first is again and restored.consumed_microbatches == count + 4
    restored.close()


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_an_iter_after_consuming_continues_where_the_loader_stands(name):
    make = MAKERS[name]
    restored, rest = restored_and_rest(make, 4, 6)
    assert ids(take(restored, 2)) == rest[:2]
    assert ids(take(iter(restored), 2)) == rest[2:4]  # neither back to the restored micro-batch nor to step 0
    assert restored.state_dict()["consumed_microbatches"] == 8
    restored.close()
    fresh = make()
    first = ids(take(iter(fresh), 2))
    assert ids(take(iter(fresh), 2)) != first and fresh.consumed_microbatches == 4  # a fresh loader goes on too
    fresh.close()


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_for_loop_broken_and_run_again_neither_repeats_nor_skips(name):
    make = MAKERS[name]
    restored, rest = restored_and_rest(make, 3, 5)
    got = []
    for _ in range(2):  # e.g. an evaluation between two stretches of training
        for batch in restored:
            got.append(batch)
            if len(got) in (2, 5):
                break
    assert ids(got) == rest and steps(got) == list(range(3, 8))
    restored.close()


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_restore_reaches_an_iterator_taken_before_it(name):
    make = MAKERS[name]
    state, rest = saved_and_rest(make, 5, 3)
    restored = make()
    iterator = iter(restored)
    take(iterator, 2)
    restored.load_state_dict(state)
    assert ids(take(iterator, 3)) == rest
    restored.close()


def test_a_stream_that_ended_starts_a_new_pass():
    config = PipelineConfig(components=GRID_1[0], micro_batch_size=8, seq_length=4096, seed=3, num_workers=1, dataloader_type="single",
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2))
    loader = pipeline(SyntheticProcessedDataset(32, seed=3), config, GRID_1[1], map_fn=None, image_token_id=IMAGE_TOKEN_ID,
                      pad_values=PAD_VALUES)
    first = take(iter(loader), None)
    again = take(iter(loader), None)
    assert steps(first) == steps(again) == [0, 1, 2, 3] and ids(first) == ids(again)
    loader.close()


def test_a_plain_iterator_continues_on_a_second_iter_and_refuses_one_after_close():
    with wrap_single(source_factory=single_rank_batches) as reference:
        expected = take(reference, 6)
    wrapped = wrap_single(single_rank_batches())
    head = take(iter(wrapped), 3)
    tail = take(iter(wrapped), 3)  # the source cannot be rewound: it goes on, labelled with its real steps
    assert steps(head + tail) == list(range(6)) and ids(head + tail) == ids(expected)
    wrapped.close()
    assert wrapped.state_dict()["consumed_microbatches"] == 6  # still says where it stood
    with pytest.raises(RuntimeError, match="^cannot iterate again after close\\(\\): the source is a plain iterator.*source_factory="):
        iter(wrapped)
    with pytest.raises(RuntimeError, match="cannot iterate again after close"):
        next(wrapped)


def test_a_restore_on_another_layout_survives_a_second_iter():
    state, rest = saved_and_rest(lambda: graph(GRID_1), 6, 2)
    restored = graph(GRID_2)
    restored.load_state_dict(state)
    iter(restored)
    assert ids(take(iter(restored), 2)) == rest
    restored.close()


def test_a_stateful_source_restores_through_a_second_iter():
    def make():
        return wrap_single(StatefulDataLoader(_Steps(), batch_size=None, num_workers=0))

    restored, rest = restored_and_rest(make, 3, 3)
    iter(restored)
    assert ids(take(iter(restored), 3)) == rest
    restored.close()


class _Steps(IterableDataset):
    """single_rank_batches as a dataset a StatefulDataLoader can restore (by counting what it skips)."""

    def __iter__(self):
        return single_rank_batches()


@pytest.mark.parametrize("loader_kind", ["DataLoader", "StatefulDataLoader"])
def test_the_dataloader_adapter_keeps_a_restore_through_a_second_iter(loader_kind):
    first = StatefulDataLoader(RankMicroBatches(lambda: graph(GRID_1)), batch_size=None, num_workers=0)
    iterator = iter(first)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))
    graph_state = json.loads(json.dumps(first.dataset.state_dict()))
    rest = ids(next(iterator) for _ in range(3))
    first.dataset.close()
    dataset = RankMicroBatches(lambda: graph(GRID_1))
    if loader_kind == "StatefulDataLoader":
        second = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
        second.load_state_dict(state)
    else:
        second = DataLoader(dataset, batch_size=None, num_workers=0)  # a plain DataLoader: the dataset restores
        dataset.load_state_dict(graph_state)
    iter(second)
    resumed = iter(second)
    assert ids(next(resumed) for _ in range(3)) == rest
    dataset.close()



def test_the_dataloader_adapter_takes_a_restore_through_a_live_iterator():
    first = RankMicroBatches(lambda: graph(GRID_1))
    iterator = iter(DataLoader(first, batch_size=None, num_workers=0))
    take(iterator, 4)
    state = json.loads(json.dumps(first.state_dict()))
    rest = ids(take(iterator, 3))
    first.close()
    dataset = RankMicroBatches(lambda: graph(GRID_1))
    live = iter(DataLoader(dataset, batch_size=None, num_workers=0))
    take(live, 2)
    dataset.load_state_dict(state)  # the iterator the training loop holds must not go on from where it was
    assert ids(take(live, 3)) == rest
    dataset.close()
