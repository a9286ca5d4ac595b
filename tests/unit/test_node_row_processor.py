"""RowProcessor: windows of rows processed into this module's samples on worker threads or processes,
windows ahead (collated after it, by the WindowCollator); restore at every position, failures, its workers' lifecycle, what its state is valid for."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from node_checks import assert_same, check_refused, check_save_load_everywhere, saved_after, take, tiny_samples

from mimo_pipes.errors import SampleError
from mimo_pipes.nodes import RowProcessor, Windower
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.module_end import ModuleEnd
from mimo_pipes.nodes.row_processor import ROWS_AHEAD_PER_WORKER, windows_ahead
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import SAMPLE_ID, Window
from mimo_pipes.testing import tail_settings

PADDED = Collator(1600, {"labels": -100, "input_ids": 7})


def process(row: dict) -> dict:
    """A row's processing: a field it did not have, and a changed one (picklable for worker processes)."""
    return {**row, "input_ids": row["input_ids"] * 3, "processed": torch.tensor([row[SAMPLE_ID]])}


def fail_on_row_5(row: dict) -> dict:
    if row[SAMPLE_ID] == 5:
        raise SampleError(5, "dataset row 5: image 0 cannot be decoded", field="images")
    return process(row)


def settings_for(per_microbatch=3, window_size=2, collator=PADDED, module=None, workers=2, method="thread"):
    return tail_settings(samples_per_rank=per_microbatch, window_size=window_size, collator=collator, module=module,
                         payload="rows", workers=workers, method=method)


def row_processor(per_microbatch=3, window_size=2, steps=7, fn=process, **kwargs) -> RowProcessor:
    settings = settings_for(per_microbatch, window_size, **kwargs)
    return RowProcessor(Windower(tiny_samples(per_microbatch, steps), settings=settings), settings=settings, process=fn)


def expected(per_microbatch=3, window_size=2, steps=7, collator=PADDED) -> list[Window]:
    settings = settings_for(per_microbatch, window_size, collator)
    windows = take(Windower(tiny_samples(per_microbatch, steps), settings=settings), None)
    return [Window(w.first_step, [[process(row) for row in mb] for mb in w.microbatches]) for w in windows]


def test_windows_are_the_rows_processed_and_left_to_collate():
    got = take(row_processor(), None)
    assert_same(got, expected())
    assert not any(w.collated for w in got) and [w.first_step for w in got] == [0, 2, 4, 6]


def test_restores_at_every_position():
    check_save_load_everywhere(row_processor)


@pytest.mark.parametrize(("per_microbatch", "window_size"), [(3, 1), (3, 3), (40, 1)])
def test_reads_its_windows_ahead_of_the_one_it_hands_out(per_microbatch, window_size):
    node = row_processor(per_microbatch=per_microbatch, window_size=window_size, steps=9)
    assert node.ahead == windows_ahead(2, per_microbatch * window_size) >= 1
    windows = 9 // window_size
    try:
        for delivered in range(1, windows + 1):
            take(node, 1)
            reader = node.source.source  # Windower -> CanonicalShardReader
            assert reader.state_dict()[reader.NEXT_STEP_KEY] // window_size == min(delivered + node.ahead, windows)
            assert len(node.processed_ahead()) <= node.ahead
    finally:
        node.shutdown()


class Fetching:
    """A processing that says when each row's fetches start and when it is processed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def start_fetches(self, row: dict) -> None:
        with self.lock:
            self.events.append(("fetch", int(row[SAMPLE_ID])))

    def __call__(self, row: dict) -> dict:
        with self.lock:
            self.events.append(("process", int(row[SAMPLE_ID])))
        return process(row)


def test_each_rows_fetches_start_when_its_window_goes_to_the_workers_before_any_of_them_is_processed():
    fetching = Fetching()
    got = take(row_processor(fn=fetching), None)
    assert_same(got, expected())
    fetched = [sid for kind, sid in fetching.events if kind == "fetch"]
    assert sorted(fetched) == sorted(sid for kind, sid in fetching.events if kind == "process") and len(set(fetched)) == len(fetched)
    for window in got:  # every row of a window: fetch started before the first of them is processed
        ids = {row[SAMPLE_ID] for mb in window.microbatches for row in mb}
        first = min(k for k, (kind, sid) in enumerate(fetching.events) if kind == "process" and sid in ids)
        assert ids <= {sid for kind, sid in fetching.events[:first] if kind == "fetch"}


@pytest.mark.launch  # starts worker processes
def test_worker_processes_give_the_threads_stream():
    threads = take(row_processor(steps=4), None)
    node = row_processor(steps=4, method="process", workers=2)
    try:
        assert_same(take(node, None), threads)
    finally:
        node.shutdown()


def test_a_row_that_fails_raises_its_error_and_a_restore_starts_over():
    node, restored = row_processor(fn=fail_on_row_5), row_processor()
    try:
        state = saved_after(node, 0)
        with pytest.raises(SampleError, match="sample 5, field 'images': dataset row 5: image 0 cannot be decoded"):
            take(node, None)
        restored.reset(state)
        assert_same(take(restored, None), expected())
    finally:
        node.shutdown()
        restored.shutdown()


def test_shutdown_stops_its_workers_and_iterating_again_restarts_them():
    def workers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(("mimo-pipes-process", "mimo-pipes-rows"))]

    node = row_processor()
    first = take(node, 1)
    assert workers()
    state = node.state_dict()
    node.shutdown()
    assert not workers()
    node.reset(state)
    assert_same(take(node, None), expected()[1:])
    assert_same(first, expected()[:1])
    node.shutdown()


@pytest.mark.parametrize(("change", "setting", "saved", "now"), [
    ({"module": "language"}, "module fields", "all", "language"),
    ({"collator": Collator(None)}, "collation pad length", 1600, None),
])
def test_refuses_a_state_made_for_other_settings(change, setting, saved, now):
    state = saved_after(row_processor(), 1)
    check_refused(lambda s: row_processor(**change).reset(s), state, "RowProcessor", setting, saved, now)


@given(st.integers(1, 256), st.integers(1, 4096))
def test_windows_ahead_hold_rows_enough_for_every_worker_and_no_window_more(workers, rows_per_window):
    ahead = windows_ahead(workers, rows_per_window)
    wanted = ROWS_AHEAD_PER_WORKER * workers
    assert ahead >= 1 and ahead * rows_per_window >= wanted
    assert ahead == 1 or (ahead - 1) * rows_per_window < wanted


class Ending(GraphNode):
    """Its source's windows, ending with a ModuleEnd (as a module's exchange does) whose agreements it records:
    each with the rows processed by then; an error is raised back, as the real agreement raises it."""

    def __init__(self, source, processed: list[int]) -> None:
        super().__init__(source)
        self.processed, self.agreed = processed, []
        self.describe({})

    def agree(self, error) -> None:
        self.agreed.append((error, len(self.processed)))
        if error is not None:
            raise error

    def next(self):
        try:
            return next(self.source)
        except StopIteration:
            raise ModuleEnd(self.agree) from None


def ending_processor(fn, steps=7, workers=12):
    processed: list[int] = []

    def counted(row):
        out = fn(row)
        processed.append(int(row[SAMPLE_ID]))
        return out

    settings = settings_for(3, 1, workers=workers)
    ending = Ending(Windower(tiny_samples(3, steps), settings=settings), processed)
    return RowProcessor(ending, settings=settings, process=counted), ending


def test_where_its_source_ends_it_agrees_once_after_every_window_read_is_processed():
    node, ending = ending_processor(process)
    try:
        assert node.ahead >= 7  # 12 workers, 3 rows a window: the whole stream is read at the first window
        first = take(node, 1)
        assert ending.agreed == [(None, 21)]  # before the first window is handed out, once all 21 rows are done
        assert_same(first + take(node, None), expected(3, 1))
        assert len(ending.agreed) == 1
    finally:
        node.shutdown()


def test_a_row_failing_after_its_source_ended_is_agreed_on_then_raised():
    node, ending = ending_processor(fail_on_row_5)
    try:
        with pytest.raises(SampleError, match="sample 5"):
            take(node, None)
        [(error, _)] = ending.agreed
        assert isinstance(error, SampleError) and "sample 5" in str(error)
    finally:
        node.shutdown()


def test_without_a_module_end_nothing_is_agreed():
    node = row_processor(per_microbatch=3, window_size=1, workers=8)
    try:
        assert_same(take(node, None), expected(3, 1))
    finally:
        node.shutdown()
