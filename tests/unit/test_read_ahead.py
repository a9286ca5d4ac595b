"""The library's read-ahead (GraphLoader's ``read_ahead``, nodes/read_ahead.py): the state saved is the one at the
last micro-batch handed out, whatever was read ahead; the stream is the same on and off; an error made on the
thread reaches the consumer in its turn with its own message and the thread has ended; close leaves no thread."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from node_checks import as_saved, tiny_samples
from torchdata.nodes import BaseNode

from mimo_pipes.errors import ConfigError
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.nodes import MicroBatchAssembler, WindowCollator, Windower
from mimo_pipes.nodes.read_ahead import ReadAhead, on_hand_out
from mimo_pipes.testing import tail_settings

THREAD = "mimo-pipes-read-ahead"


def graph(window_size: int = 2, steps: int = 12, fail_at: int | None = None) -> BaseNode:
    settings = tail_settings(samples_per_rank=2, window_size=window_size)
    reader = tiny_samples(2, steps)
    if fail_at is not None:
        reader = _FailingAt(reader, fail_at)
    return MicroBatchAssembler(WindowCollator(Windower(reader, settings=settings), settings=settings), settings=settings)


class _FailingAt(BaseNode):
    """Its source's samples, raising on the one of ``step``."""

    def __init__(self, source: BaseNode, step: int) -> None:
        super().__init__()
        self.source, self.step = source, step

    def reset(self, initial_state=None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self):
        sample = next(self.source)
        if int(sample["step"]) == self.step:
            raise ValueError(f"row {int(sample['sample_id'])} cannot be decoded")
        return sample

    def get_state(self):
        return self.source.state_dict()


def steps_of(batches) -> list[tuple[int, list[int]]]:
    return [(int(batch["step"]), [int(i) for i in batch["sample_ids"]]) for batch in batches]


def read_ahead_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD]


def take(loader, count: int) -> list[dict]:
    return [next(loader) for _ in range(count)]


def settle(loader: GraphLoader) -> None:
    """Wait until the loader's thread has made all it may ahead (or ended)."""
    reader = loader._reader
    for _ in range(200):
        if reader is None or len(reader._made) >= reader.depth or not reader.alive:
            return
        time.sleep(0.01)


@pytest.mark.parametrize("window_size", [1, 3])
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_stream_is_the_same_with_read_ahead_on_and_off(window_size, depth):
    off = GraphLoader(graph(window_size))
    on = GraphLoader(graph(window_size), read_ahead=depth)
    assert steps_of(on) == steps_of(off) and len(steps_of(GraphLoader(graph(window_size)))) == 12
    on.close()


@pytest.mark.parametrize("window_size", [1, 3])
@pytest.mark.parametrize("taken", [0, 1, 4, 5, 11])
def test_a_state_saved_with_read_ahead_restores_at_the_next_micro_batch(window_size, taken):
    reference = steps_of(GraphLoader(graph(window_size)))
    first = GraphLoader(graph(window_size), read_ahead=3)
    head = steps_of(take(first, taken))
    settle(first)  # the thread stands up to three micro-batches ahead when the state is taken
    state = as_saved(first.state_dict())
    assert state[GraphLoader.CONSUMED_KEY] == taken
    first.close()
    for depth in (0, 3):
        restored = GraphLoader(graph(window_size), read_ahead=depth)
        restored.load_state_dict(state)
        assert head + steps_of(restored) == reference, depth
        restored.close()


@settings(max_examples=15, deadline=None)
@given(taken=st.integers(0, 12), depth=st.integers(1, 4), window_size=st.sampled_from([1, 2, 4]))
def test_the_state_is_the_state_off_would_save(taken, depth, window_size):
    off = GraphLoader(graph(window_size))
    on = GraphLoader(graph(window_size), read_ahead=depth)
    take(off, taken)
    take(on, taken)
    settle(on)
    assert as_saved(on.state_dict()) == as_saved(off.state_dict())
    on.close()


def test_an_error_on_the_thread_reaches_the_consumer_in_its_turn_and_the_thread_ends():
    before = len(read_ahead_threads())
    loader = GraphLoader(graph(window_size=1, fail_at=4), read_ahead=3)
    assert [step for step, _ in steps_of(take(loader, 4))] == [0, 1, 2, 3]  # those made before the error first
    with pytest.raises(ValueError, match=r"^row \d+ cannot be decoded$"):
        next(loader)
    assert len(read_ahead_threads()) == before
    assert loader.state_dict()[GraphLoader.CONSUMED_KEY] == 4
    loader.close()


def test_close_stops_the_thread_and_iterating_again_continues_where_the_consumer_stood():
    before = len(read_ahead_threads())
    reference = steps_of(GraphLoader(graph()))
    loader = GraphLoader(graph(), read_ahead=2)
    head = steps_of(take(loader, 3))
    settle(loader)
    assert len(read_ahead_threads()) == before + 1
    loader.close()
    assert len(read_ahead_threads()) == before
    assert head + steps_of(loader) == reference
    loader.close()
    assert len(read_ahead_threads()) == before


def test_a_finished_stream_leaves_no_thread():
    before = len(read_ahead_threads())
    loader = GraphLoader(graph(), read_ahead=2)
    assert len(steps_of(loader)) == 12
    assert len(read_ahead_threads()) == before


def test_prepare_runs_on_the_read_ahead_thread():
    loader = GraphLoader(graph(), read_ahead=2)
    loader.prepare_with(lambda batch: (threading.current_thread().name, int(batch["step"])))
    made = [next(loader) for _ in range(3)]
    loader.close()
    assert made == [(THREAD, 0), (THREAD, 1), (THREAD, 2)]


def test_hand_out_actions_follow_the_consumer():
    handed: list[int] = []
    counter = iter(range(100))

    def make() -> int:
        item = next(counter)
        on_hand_out(lambda: handed.append(item))
        return item

    reader = ReadAhead(make, lambda: None, depth=3)
    for expected in range(5):
        item, _ = reader.take()
        assert item == expected and handed == list(range(expected + 1))
    reader.stop()
    assert not reader.alive


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_bad_read_ahead_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match=r"^read_ahead"):
        GraphLoader(graph(), read_ahead=value)


def test_the_pipeline_setting_is_checked_and_named():
    from mimo_pipes.config import PipelineConfig

    with pytest.raises(ConfigError, match=r"^read_ahead: must be an integer >= 0, got -1$"):
        PipelineConfig(read_ahead=-1).validate()
    assert PipelineConfig().read_ahead > 0  # on by default


def test_the_run_flag_sets_it():
    from mimo_pipes.cli.job.args import config_from_args
    from mimo_pipes.cli.main import build_parser

    config, _ = config_from_args(build_parser().parse_args(["run", "--read-ahead", "0"]))
    assert config.read_ahead == 0


def test_an_nccl_exchange_on_the_read_ahead_thread_is_refused_with_one_hardware_queue():
    from mimo_pipes.config.transport import check_read_ahead

    with pytest.raises(ConfigError, match=r"^read_ahead: 2 with an NCCL exchange group is refused under CUDA_DEVICE_MAX_CONNECTIONS=1"):
        check_read_ahead(2, exchange_on_gpu=True, exchanges=True, device_max_connections="1")
    assert check_read_ahead(2, exchange_on_gpu=False, exchanges=True, device_max_connections="1") == 2  # Gloo
    assert check_read_ahead(0, exchange_on_gpu=True, exchanges=True, device_max_connections="1") == 0
    assert check_read_ahead(2, exchange_on_gpu=True, exchanges=True, device_max_connections=None) == 2



def test_after_the_error_the_loader_raises_it_again_and_after_the_end_ends_again():
    loader = GraphLoader(graph(window_size=1, fail_at=1), read_ahead=2)
    next(loader)
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot be decoded"):
            next(loader)
    loader.close()
    reader = ReadAhead(iter(range(2)).__next__, lambda: None, depth=2)
    assert [reader.take()[0] for _ in range(2)] == [0, 1]
    for _ in range(2):
        with pytest.raises(StopIteration):
            reader.take()


def test_an_undrained_close_leaves_no_thread_and_iterating_again_continues():
    before = len(read_ahead_threads())
    reference = steps_of(GraphLoader(graph()))
    loader = GraphLoader(graph(), read_ahead=3)
    head = steps_of(take(loader, 2))
    loader.close(drain=False)
    assert len(read_ahead_threads()) == before
    assert head + steps_of(loader) == reference


class _LiveState(BaseNode):
    """Counts up, and says its state as ONE dict it goes on changing (a node of another library may)."""

    def __init__(self, end: int) -> None:
        super().__init__()
        self.end, self.live = end, {"next": 0}

    def reset(self, initial_state=None) -> None:
        super().reset(initial_state)
        self.live["next"] = 0 if initial_state is None else initial_state["next"]

    def next(self):
        if self.live["next"] >= self.end:
            raise StopIteration
        self.live["next"] += 1
        return self.live["next"] - 1

    def get_state(self):
        return self.live


def test_a_state_its_node_goes_on_changing_is_kept_as_it_was_at_its_item():
    """The state kept beside an item made ahead is a copy where the node might change it later (kept_state): saved
    after 3 items with 4 read ahead, restored, the loader continues at item 3."""
    from mimo_pipes.nodes.base import kept_state

    tail = graph()  # a GraphNode's state is built afresh: taken as it is, it stays what it was
    taken = kept_state(tail)()
    kept = as_saved(taken)
    take(tail, 5)
    assert as_saved(taken) == kept != as_saved(tail.state_dict())
    node = _LiveState(12)
    first = GraphLoader(node, read_ahead=4)
    assert take(first, 3) == [0, 1, 2]
    settle(first)
    assert node.live["next"] == 7  # the thread stands 4 items ahead, and the node's one dict says so
    state = as_saved(first.state_dict())
    first.close()
    restored = GraphLoader(_LiveState(12), read_ahead=4)
    restored.load_state_dict(state)
    assert list(restored) == list(range(3, 12))
    restored.close()
