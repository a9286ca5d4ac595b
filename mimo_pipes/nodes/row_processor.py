"""RowProcessor: processes each exchanged window's rows into this module's samples, in parallel, one window ahead."""

from __future__ import annotations

import collections
import copy
import multiprocessing
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, NamedTuple

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, collation_settings, valid_for
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Sample, Window, WindowReceipt
from mimo_pipes.settings.tail_settings import TailSettings

AHEAD = 1
"""Windows processed beyond the one the consumer waits for: decoding overlaps training, and the memory of
processed samples stays one window above what the consumer holds."""


class _Pending(NamedTuple):
    window: Future[Window]  # the window processed and collated
    rows: list[Future[Sample]]  # its rows' processing, cancelled when the window is dropped
    state_after: Any  # the source's state right after it handed out the window
    receipt: WindowReceipt | None  # the source's receipt for the window read (see Window.receipt)


class RowProcessor(BaseNode[Window]):
    """Turns every window of rows (from the exchange, or the Windower without one) into this module's
    collated micro-batches: each row goes through ``process`` (its module's fields:
    :class:`~mimo_pipes.data.module_processor.ModuleProcessor`) on ``settings.processing.workers``
    threads or worker processes (``method``), on the rank that trains on it, so decoding and resizing are
    balanced by the exchange's assignment. It reads :data:`AHEAD` windows ahead of the one asked for.

    A failure (a row that cannot be processed, a window that cannot be collated) raises here and, when the
    source is a :class:`~mimo_pipes.nodes.BalanceExchange`, is announced to the module's other ranks through
    it (:meth:`~mimo_pipes.nodes.BalanceExchange.fail`). The state is the source's state after the last
    delivered window; windows processed ahead are dropped on a restore and processed again. It is valid for
    one module's fields and one collation. ``close()`` stops its workers (iterating again restarts them).
    """

    SOURCE_KEY = "source"
    VALID_FOR_KEY = VALID_FOR_KEY

    def __init__(self, source: BaseNode[Window], *, settings: TailSettings, process: Callable[[Sample], Sample]) -> None:
        super().__init__()
        self.source = source
        self.process = process
        self.collator: Collator = settings.collator
        self.workers = settings.processing.workers
        self.method = settings.processing.method
        self._pool: Executor | None = None
        self._collating: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None
        self._pending: collections.deque[_Pending] = collections.deque()
        self.valid_for = valid_for(type(self).__name__, {"module fields": settings.fields.role, **collation_settings(self.collator)})

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None:
            check_valid_for(initial_state, self.valid_for)
        super().reset(initial_state)
        self._drop_pending()
        self.source.reset(None if initial_state is None else copy.deepcopy(initial_state[self.SOURCE_KEY]))
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        self._source_ended = False

    def next(self) -> Window:
        while len(self._pending) <= AHEAD and not self._source_ended:
            try:
                window = next(self.source)
            except StopIteration:
                self._source_ended = True
                break
            self._pending.append(self._submit(window, copy.deepcopy(self.source.state_dict())))
        if not self._pending:
            raise StopIteration
        pending = self._pending.popleft()
        try:
            window = pending.window.result()
        except BaseException as error:
            self._drop_pending()
            if pending.receipt is not None:
                pending.receipt.failed(error)
            raise
        self._state_after_delivered = pending.state_after
        if pending.receipt is not None:  # the exchange's observers and metrics follow the window handed on, not the read-ahead
            pending.receipt.delivered()
        return window

    def processed_ahead(self) -> list[Window]:
        """The windows processed and not yet handed out (what this node holds beyond the consumer)."""
        pending = tuple(self._pending)  # one step under the GIL: safe beside the consumer's thread
        return [p.window.result() for p in pending if p.window.done() and not p.window.cancelled() and p.window.exception() is None]

    def _submit(self, window: Window, state_after: Any) -> _Pending:
        pool, collating = self._executors()
        task = self.process if self.method == "thread" else _process_installed
        rows = [[pool.submit(task, row) for row in microbatch] for microbatch in window.microbatches]
        collated = collating.submit(_collate, self.collator, window, rows)
        return _Pending(collated, [future for microbatch in rows for future in microbatch], state_after, window.receipt)

    def _executors(self) -> tuple[Executor, ThreadPoolExecutor]:
        if self._pool is None or self._collating is None:
            if self.method == "thread":
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="mimo-pipes-process")
            else:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_install, initargs=(self.process,))
            # Collation waits for the window's rows: a thread of its own, so a window never waits behind its rows.
            self._collating = ThreadPoolExecutor(1, thread_name_prefix="mimo-pipes-collate")
            self._finalizer = weakref.finalize(self, _shut_down, self._pool, self._collating)
        return self._pool, self._collating

    def _drop_pending(self) -> None:
        for pending in self._pending:
            for future in pending.rows:
                future.cancel()
            pending.window.cancel()
        self._pending.clear()

    def close(self) -> None:
        """Stop the workers after the rows they are processing; pending windows are dropped."""
        self._drop_pending()
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._pool = self._collating = None

    def get_state(self) -> dict[str, Any]:
        return {self.VALID_FOR_KEY: copy.deepcopy(self.valid_for), self.SOURCE_KEY: copy.deepcopy(self._state_after_delivered)}


def _collate(collator: Collator, window: Window, rows: list[list[Future[Sample]]]) -> Window:
    """The window's processed rows, collated; its composition (who holds which micro-batch) kept."""
    processed = [[future.result() for future in microbatch] for microbatch in rows]
    return collator.window(Window(window.first_step, processed, composition=window.composition))


def _shut_down(pool: Executor, collating: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=True, cancel_futures=True)
    collating.shutdown(wait=True, cancel_futures=True)


_installed: Callable[[Sample], Sample] | None = None


def _install(process: Callable[[Sample], Sample]) -> None:
    """Worker process set-up: the processing function arrives once, not with every row."""
    global _installed
    _installed = process


def _process_installed(row: Sample) -> Sample:
    assert _installed is not None
    return _installed(row)
