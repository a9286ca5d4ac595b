"""GraphLoader.close(): every graph thread stops (torchdata's mapper workers too), and iterating again
resumes exactly where the loader stood."""

from __future__ import annotations

import threading
import time

from torchdata.nodes import BaseNode, Batcher, IterableWrapper, ParallelMapper, Prefetcher

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.graph.traversal import graph_nodes
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def tag(sample: dict) -> dict:
    sample["tagged"] = True
    return sample


def graph():
    config = PipelineConfig(
        components=("language=dp=1",),
        micro_batch_size=4,
        num_workers=2,
        processing="thread",  # torchdata's thread mappers, which close() wakes
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=3),
    )
    return pipeline(SyntheticProcessedDataset(64), config, RankLayout(0, 1, 1), map_fn=tag,
                       image_token_id=IMAGE_TOKEN_ID, pad_values={})


def worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t is not threading.main_thread()]


def test_close_stops_mapper_threads_and_iteration_resumes_in_place():
    reference = graph()
    expected = [next(reference)["sample_ids"] for _ in range(8)]
    reference.close()
    before = set(worker_threads())
    loader = graph()
    got = [next(loader)["sample_ids"] for _ in range(4)]  # mid-window (W=3)
    assert set(worker_threads()) - before, "the mapper should be running on threads"
    loader.close()
    assert set(worker_threads()) <= before, f"threads left after close: {set(worker_threads()) - before}"
    got += [next(loader)["sample_ids"] for _ in range(4)]
    assert got == expected and loader.consumed_microbatches == 8
    loader.close()
    loader.close()
    assert set(worker_threads()) <= before


def test_closing_a_mapper_wakes_its_workers_and_sort_thread_instead_of_waiting_for_their_poll(monkeypatch):
    """torchdata's mapper threads poll their queues, a tenth of a second a poll, and a close waited for each in
    turn. Made to poll for ten minutes here, they end within the joins below only because the close woke them
    (the bound on the joins keeps a regression from hanging the run; no timing is asserted)."""
    import torchdata.nodes._apply_udf as apply_udf
    import torchdata.nodes.map as torchdata_map

    from mimo_pipes.graph.torchdata_guards import stop_torchdata_threads, wake_mapper_threads

    calls = []
    node = ParallelMapper(IterableWrapper(range(100)), lambda x: calls.append(x) or x, num_workers=2, method="thread")
    node.reset()
    assert [next(node) for _ in range(3)] == [0, 1, 2]
    monkeypatch.setattr(torchdata_map, "QUEUE_TIMEOUT", 600.0)  # read by the threads at each poll
    monkeypatch.setattr(apply_udf, "QUEUE_TIMEOUT", 600.0)
    inner = next(n for n in graph_nodes(node) if type(n).__name__ == "_ParallelMapperImpl")
    iterator = inner._it
    threads = [*iterator._workers, iterator._sort_thread]
    time.sleep(0.3)  # every thread back in a (now long) poll of an empty queue: the read-ahead is mapped
    mapped = len(calls)
    wake_mapper_threads(iterator)
    deadline = time.monotonic() + 30
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads)
    assert len(calls) == mapped  # the stop mapped nothing more
    monkeypatch.undo()
    stop_torchdata_threads(inner)
    assert not iterator._read_thread.is_alive()


class Zip(GraphNode[tuple]):
    """Reads several branches in step; names them in ``sources()``, not through ``source``."""

    def __init__(self, branches: list[BaseNode]) -> None:
        super().__init__()
        self.branches = branches

    def sources(self) -> tuple[BaseNode, ...]:
        return tuple(self.branches)

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        for index, branch in enumerate(self.branches):
            branch.reset(None if initial_state is None else initial_state["branches"][index])

    def next(self) -> tuple:
        return tuple(next(branch) for branch in self.branches)

    def get_state(self) -> dict:
        return {"branches": [branch.state_dict() for branch in self.branches]}


class Holder(GraphNode):
    """Passes items of a node it keeps under another name than ``source``, named in ``sources()``."""

    def __init__(self, upstream: BaseNode) -> None:
        super().__init__()
        self.upstream = upstream
        self.loop: BaseNode | None = None

    def sources(self) -> tuple[BaseNode, ...]:
        return (self.upstream,) if self.loop is None else (self.upstream, self.loop)

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.upstream.reset(None if initial_state is None else initial_state["upstream"])

    def next(self):
        return next(self.upstream)

    def get_state(self) -> dict:
        return {"upstream": self.upstream.state_dict()}


def threads_left(before: set[threading.Thread], wait_s: float = 30.0) -> set[threading.Thread]:
    """Threads started since ``before`` that are still alive after up to ``wait_s`` (stopping is not instant)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {t for t in threading.enumerate() if t not in before and t is not threading.main_thread()}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_close_stops_threads_of_nodes_that_name_their_sources():
    before = set(threading.enumerate())
    mapped = ParallelMapper(IterableWrapper(range(1000)), lambda x: x * 2, num_workers=2, method="thread")
    prefetched = Prefetcher(Holder(ParallelMapper(IterableWrapper(range(1000)), lambda x: x + 1, num_workers=2, prebatch=3)), 4)
    loader = GraphLoader(Zip([Holder(mapped), Batcher(prefetched, batch_size=2)]))
    first = [next(loader) for _ in range(5)]
    assert first[0] == (0, [1, 2]) and first[4] == (8, [9, 10])
    assert threads_left(before, wait_s=0), "the graph should run threads"
    loader.close()
    assert not threads_left(before), "threads left after close()"
    assert next(loader) == (10, [11, 12])  # the position is kept
    loader.close()
    assert not threads_left(before)


def test_graph_nodes_visits_each_node_once_consumers_first():
    shared = IterableWrapper(range(3))
    left, right = Holder(shared), Holder(shared)
    root = Zip([left, right])
    right.loop = root  # a back link: no endless walk
    nodes = graph_nodes(root)
    assert nodes[0] is root and nodes[-1] is shared
    assert len(nodes) == len({id(node) for node in nodes}) == 4
