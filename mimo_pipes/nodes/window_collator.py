"""WindowCollator: collates every window into its micro-batches, the one place of the graph that collates."""

from __future__ import annotations

import collections
import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from torchdata.nodes import BaseNode

from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.read_ahead import fill_ahead
from mimo_pipes.nodes.window_exchange import ExchangeReport
from mimo_pipes.observe.observer import ExchangeRecord
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Window

AHEAD = 1
"""Windows collated beyond the one the consumer asked for (with ``ahead``): at most one collated window more
than the consumer holds."""


class _Collating(NamedTuple):
    collated: Future[tuple[Window, float]]  # the window collated, and how long that took
    state_after: Any  # the source's state right after it handed out the window
    record: ExchangeRecord | None  # what the window's exchange did (Window.record), reported when handed on


class WindowCollator(GraphNode[Window]):
    """Collates each window of its source with ``settings.collator`` (padding, concatenation:
    :mod:`mimo_pipes.samples.collate`); nothing else in the graph collates.

    With ``ahead`` (its source works on threads of its own: an overlapped exchange, row processing) it reads
    :data:`AHEAD` window ahead of the one asked for, on the calling thread, and collates it on a thread of its
    own, so the training thread only hands out collated windows; otherwise it collates on the calling thread
    (nothing else would overlap it). A window's record (``Window.record``, from the exchange) goes to
    ``report`` (the exchange's :class:`~mimo_pipes.nodes.window_exchange.ExchangeReport`) when the window is
    handed on, with the collation's time as its ``seconds["collate"]``, so observers and metrics follow the
    consumer, not the read-ahead.

    A window that cannot be collated raises here, on the consumer's thread (a sample at fault is named with
    its field: :class:`~mimo_pipes.errors.SampleError`); the loader then tells the nodes before it, and the
    exchange announces it to the module's other ranks in place of its next exchange.

    The state is the source's state after the last window handed on; a window collated ahead is dropped on a
    restore and read again. It has no setting of its own to be valid for: the collation it makes is what the
    assembler after it, and the exchange before it, are described with; a state saved before this node was
    part of the graph (its source's state, one level up) is read as its source's. :meth:`shutdown` stops its
    thread (iterating again restarts it).
    """

    def __init__(self, source: BaseNode[Window], *, settings: TailSettings, ahead: bool = False,
                 report: ExchangeReport | None = None) -> None:
        super().__init__(source)
        self.collator: Collator = settings.collator
        self.ahead = ahead
        self.report = report
        self._thread: ThreadPoolExecutor | None = None
        self._pending: collections.deque[_Collating] = collections.deque()

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None and self.VALID_FOR_KEY in initial_state:
            initial_state = {self.SOURCE_KEY: initial_state}  # saved before this node existed: its source's state
        super().reset(initial_state)

    def discard_ahead(self) -> None:
        self._drop_pending()

    def restore(self, initial_state: dict | None) -> None:
        self._state_after_delivered = copy.deepcopy(self.source.state_dict()) if self.ahead else None
        self._source_ended = False

    def next(self) -> Window:
        if not self.ahead:
            window = next(self.source)
            collated, seconds = _collate(self.collator, window)
            return self._hand_on(collated, seconds, window.record)
        if not self._source_ended:
            self._source_ended = not fill_ahead(self.source, self._pending, AHEAD, self._submit)
        if not self._pending:
            self.shutdown()  # a finished stream leaves no thread behind
            raise StopIteration
        pending = self._pending.popleft()
        try:
            collated, seconds = pending.collated.result()
        except BaseException:
            self._drop_pending()
            raise  # the loader tells the nodes before this one (the exchange announces it to its peers)
        self._state_after_delivered = pending.state_after
        return self._hand_on(collated, seconds, pending.record)

    def _submit(self, window: Window, state_after: Any) -> _Collating:
        return _Collating(self._executor().submit(_collate, self.collator, window), state_after, window.record)

    def collated_ahead(self) -> list[Window]:
        """The windows collated and not yet handed out (what this node holds beyond the consumer)."""
        pending = tuple(self._pending)  # one step under the GIL: safe beside the consumer's thread
        done = [p.collated for p in pending if p.collated.done() and not p.collated.cancelled()]
        return [future.result()[0] for future in done if future.exception() is None]

    def _hand_on(self, window: Window, seconds: float, record: ExchangeRecord | None) -> Window:
        if record is not None:
            record.seconds["collate"] = seconds
        if self.report is not None:
            self.report.publish(record)
        return window

    def _executor(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="mimo-pipes-collate")
        return self._thread

    def _drop_pending(self) -> None:
        for pending in self._pending:
            pending.collated.cancel()
        self._pending.clear()

    def shutdown(self) -> None:
        """Stop the collating thread after the window it is collating; windows collated ahead are dropped."""
        self._drop_pending()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True, cancel_futures=True)

    def source_state(self) -> Any:
        return self._state_after_delivered if self.ahead else super().source_state()


def _collate(collator: Collator, window: Window) -> tuple[Window, float]:
    """``window`` collated (its composition kept), and the seconds it took."""
    started = time.perf_counter()
    collated = collator.window(window)
    return collated, time.perf_counter() - started
