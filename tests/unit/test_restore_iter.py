"""A restored position survives every later ``iter()``: of a GraphLoader, of balance_iterator's loader and of
the DataLoader adapter (under torch's DataLoader and torchdata's StatefulDataLoader). torchdata's Loader
restarts a restored loader at step 0 on a second ``iter()``; every rank agrees, so no check would catch it."""

from __future__ import annotations

import json

import pytest
from node_checks import take
from test_elastic_loader import GRID_1, GRID_2, graph
from test_plugin_dist import single_rank_batches, wrap_single
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from mimo_pipes.adapters.dataloader import RankMicroBatches


def ids(batches) -> list[list[int]]:
    return [sorted(batch["sample_ids"]) for batch in batches]


def saved_and_rest(make, count: int, rest: int):
    """The state after ``count`` items of a fresh loader (through JSON), and the ``rest`` items after it."""
    loader = make()
    take(loader, count)
    state = json.loads(json.dumps(loader.state_dict()))
    after = ids(take(loader, rest))
    loader.close()
    return state, after


MAKERS = {
    "graph": lambda: graph(GRID_1),
    "graph-window-3": lambda: graph(GRID_1, across=False, seed=11),
    "balance_iterator-factory": lambda: wrap_single(source_factory=single_rank_batches),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("count", [3, 5])
def test_a_second_iter_after_a_restore_resumes_there(name, count):
    make = MAKERS[name]
    state, rest = saved_and_rest(make, count, 4)
    restored = make()
    restored.load_state_dict(state)
    first = iter(restored)
    again = iter(restored)  # the common pattern: it = iter(loader), then a for loop over the loader
    assert ids(take(again, 4)) == rest
    assert first is again and restored.num_yielded == count + 4
    restored.close()


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_an_iter_after_consuming_restarts_at_the_restored_position_not_step_0(name):
    make = MAKERS[name]
    state, rest = saved_and_rest(make, 4, 3)
    restored = make()
    restored.load_state_dict(state)
    assert ids(take(restored, 2)) == rest[:2]
    assert restored.state_dict()["num_yielded"] == 6
    assert ids(take(iter(restored), 3)) == rest  # a fresh iteration starts where the restore put it
    assert restored.num_yielded == 7
    restored.close()


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

    state, rest = saved_and_rest(make, 3, 3)
    restored = make()
    restored.load_state_dict(state)
    iter(restored)
    assert ids(take(iter(restored), 3)) == rest
    restored.close()


class _Steps(__import__("torch").utils.data.IterableDataset):
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

