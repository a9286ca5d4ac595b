"""The library's own threads run torch's operations on themselves alone (samples/serial_torch.py): the read-ahead
thread, RowProcessor's worker threads; the training thread and every other thread keep torch's setting as the
program made it, also beside torchdata's mapper threads, which set theirs with torch's process-wide call."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from node_checks import take, tiny_samples
from test_node_row_processor import process, row_processor
from test_read_ahead import graph
from torchdata.nodes import BaseNode, ParallelMapper

from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.nodes import MicroBatchAssembler, SnapshotGuard, WindowCollator, Windower
from mimo_pipes.samples.serial_torch import serial_torch_here
from mimo_pipes.testing import tail_settings


@pytest.fixture
def program_threads() -> Iterator[int]:
    """The program's setting made 2 (more than one, whatever the machine), put back after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def on_a_thread(function: Callable[[], Any]) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(function()))
    thread.start()
    thread.join()
    return out[0]


def test_a_thread_that_asks_runs_serially_and_every_other_keeps_the_programs_setting(program_threads):
    def asking() -> tuple[int, int]:
        before = torch.get_num_threads()
        serial_torch_here()
        serial_torch_here()  # a second call changes nothing
        return before, torch.get_num_threads()

    assert on_a_thread(asking) == (program_threads, 1)
    assert torch.get_num_threads() == program_threads  # the training thread
    assert on_a_thread(torch.get_num_threads) == program_threads  # a thread that starts later


def test_a_program_that_runs_torch_on_one_thread_is_left_so(program_threads):
    torch.set_num_threads(1)
    assert on_a_thread(lambda: (serial_torch_here(), torch.get_num_threads())[1]) == 1
    assert on_a_thread(torch.get_num_threads) == 1


class _Recording(BaseNode):
    """Its source's items, noting torch's threads on the thread that reads each."""

    def __init__(self, source: BaseNode, seen: list[int]) -> None:
        super().__init__()
        self.source, self.seen = source, seen

    def reset(self, initial_state=None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)

    def next(self):
        self.seen.append(torch.get_num_threads())
        return next(self.source)

    def get_state(self):
        return self.source.state_dict()


def test_the_read_ahead_thread_collates_serially(program_threads):
    seen: list[int] = []
    loader = GraphLoader(_Recording(graph(steps=6), seen), read_ahead=2)
    try:
        assert len(list(loader)) == 6
    finally:
        loader.close()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == program_threads


def test_rows_processed_on_threads_run_torch_serially(program_threads):
    seen: list[int] = []

    def noting(row: dict) -> dict:
        seen.append(torch.get_num_threads())
        return process(row)

    windows = take(row_processor(fn=noting, workers=3), None)
    assert windows and len(seen) == sum(len(mb) for w in windows for mb in w.microbatches)
    assert set(seen) == {1}


def test_a_loader_with_torchdata_mappers_leaves_the_thread_that_iterates_it_the_programs_setting(program_threads):
    # torchdata's mapper threads call torch.set_num_threads(1), torch's setting for threads yet to run an operation:
    # a thread whose first torch operation comes after they start would keep one thread.
    # Built here, iterated on a thread that has run no torch operation yet (a training thread's start).
    settings = tail_settings(samples_per_rank=2, window_size=2)
    mapped = ParallelMapper(SnapshotGuard(tiny_samples(2, 6)), lambda sample: sample, num_workers=2, method="thread")
    loader = GraphLoader(MicroBatchAssembler(WindowCollator(Windower(mapped, settings=settings), settings=settings), settings=settings))
    try:
        assert on_a_thread(lambda: (len(list(loader)), torch.get_num_threads())) == (6, program_threads)
    finally:
        loader.close()

def test_threads_that_ask_change_nothing_for_threads_that_start_beside_them(program_threads):
    seen: list[int] = []
    for _ in range(20):
        start = threading.Barrier(16)

        def asking(start: threading.Barrier = start) -> None:
            start.wait()
            serial_torch_here()

        def beside(start: threading.Barrier = start) -> None:  # a thread of the program's, running its first torch operation meanwhile
            start.wait()
            seen.append(torch.get_num_threads())

        threads = [threading.Thread(target=asking if k % 2 else beside) for k in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seen.append(on_a_thread(torch.get_num_threads))  # and one that starts after them
    assert set(seen) == {program_threads}
