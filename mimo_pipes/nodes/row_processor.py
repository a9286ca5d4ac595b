"""RowProcessor: processes each exchanged window's rows into this module's samples, in parallel, windows ahead."""

from __future__ import annotations

import collections
import copy
import itertools
import math
import operator
import os
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.validity import collation_settings
from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.errors import MAX_REASON, PeerError, SampleError, row_reason
from mimo_pipes.exchange.failure_agreement import agree_on_failures
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.module_end import ModuleEnd
from mimo_pipes.nodes.read_ahead import fill_ahead
from mimo_pipes.observe.observer import ExchangeRecord
from mimo_pipes.observe.warning_tally import Recorded, WarningsRecorded, replayed
from mimo_pipes.samples import handover
from mimo_pipes.samples.buffer_pool import BufferPool
from mimo_pipes.samples.collate import lend_rows
from mimo_pipes.samples.masking import mask_failed
from mimo_pipes.samples.pixel_destination import pixels_into
from mimo_pipes.samples.sample import SAMPLE_ID, STEP, Sample, Window
from mimo_pipes.samples.segment_pool import SegmentPool
from mimo_pipes.samples.serial_torch import serial_torch_here
from mimo_pipes.samples.worker_start import one_thread_per_worker, worker_context

PIXELS = "pixel_values"  # the field worker processes write straight into their micro-batch's buffer
ROWS_AHEAD_PER_WORKER = 2
"""Rows handed to the workers beyond the window the consumer waits for, per worker: enough that every worker
has a row to take while the consumer waits for a window's slowest row (with one window of 4 rows ahead, 14
workers were never more than 8 rows busy). Bounded: at most this many processed rows a worker wait ahead of
the consumer (a DataLoader holds two micro-batches a worker)."""


def windows_ahead(workers: int, rows_per_window: int) -> int:
    """Windows processed beyond the one asked for: the fewest that hold :data:`ROWS_AHEAD_PER_WORKER` rows a
    worker, and at least one (decoding overlaps training)."""
    return max(1, -(-ROWS_AHEAD_PER_WORKER * workers // max(rows_per_window, 1)))


class _Pending(NamedTuple):
    window: Future[Window]  # the window processed (its failures agreed on and masked, with masking)
    rows: list[Future[Sample]]  # its rows' processing, cancelled when the window is dropped
    state_after: Any  # the source's state right after it handed out the window
    record: ExchangeRecord | None  # what the window's exchange did (see Window.record), reported when handed on
    dropped: threading.Event  # set when the window is dropped: its agreement still runs, nothing else


@runtime_checkable
class CountsRows(Protocol):
    """A row processing that tells, before it runs, how many pixel rows a row will give (None where it cannot):
    what sizes a micro-batch's buffer before its rows are processed."""

    def counted_rows(self, row: Sample) -> int | None: ...


@runtime_checkable
class StartsFetches(Protocol):
    """A row processing that can start fetching what a row names (its image files in object storage) without
    waiting: called for every row of a window as the window is handed to the workers, so the fetches run with
    their own concurrency rather than one per worker."""

    def start_fetches(self, row: Sample) -> None: ...


class Masking(NamedTuple):
    """How a row that fails after the exchange is masked (see :mod:`mimo_pipes.samples.masking`): what the
    module trains on in its place, and the group of the job's ranks the failures are agreed on (None: this
    rank alone, when it is the only one processing rows of these samples)."""

    stand_in: Callable[[Sample], Sample]
    group: Any = None


class RowProcessor(GraphNode[Window]):
    """Turns every window of rows (from the exchange, or the Windower without one) into this module's
    samples: each row goes through ``process`` (its module's fields:
    :class:`~mimo_pipes.data.processing.module_processor.ModuleProcessor`) on ``settings.processing.workers``
    threads or worker processes (``method``), on the rank that trains on it, so decoding and resizing are
    balanced by the exchange's assignment. It reads :attr:`ahead` windows ahead of the one asked for
    (:func:`windows_ahead`: rows enough for every worker); the windows it hands on are collated after it
    (:class:`~mimo_pipes.nodes.window_collator.WindowCollator`).

    A row that cannot be processed raises here; the loader then tells the nodes before it
    (:meth:`~mimo_pipes.nodes.BalanceExchange.abort` announces it to the module's other ranks in place of its next
    exchange). Where the exchange has ended (:class:`~mimo_pipes.nodes.module_end.ModuleEnd`) the windows still
    pending are processed and their outcome agreed on at once, so a failure among them fails every rank too. Each window
    from an exchange keeps its record (``Window.record``) on the window it hands on. With ``masking``
    (``settings.processing.mask_failed``: ``--skip-bad-samples``) a row whose processing raises its
    :class:`~mimo_pipes.errors.SampleError` is masked instead: every rank of the job says which of each
    window's rows failed, in window order on its rows thread
    (:func:`~mimo_pipes.exchange.failure_agreement.agree_on_failures`), and every module masks those samples
    before the window is handed out; :attr:`masked` counts them (each module counts every failure of the
    job). The state is the source's state after the last delivered window; windows processed ahead are
    dropped on a restore and processed again. It is valid for one module's fields and the collation its
    windows are for. :meth:`shutdown` stops its workers (iterating again restarts them).
    """

    def __init__(
        self, source: BaseNode[Window], *, settings: TailSettings, process: Callable[[Sample], Sample], masking: Masking | None = None,
    ) -> None:
        super().__init__(source)
        if settings.processing.mask_failed and masking is None:
            raise ValueError("settings.processing.mask_failed needs masking: what stands in for a row that fails")
        self.process = process
        self.masking = masking if settings.processing.mask_failed else None
        self.masked = 0  # samples masked so far (every failure of the job, as every module masks it)
        self.workers = settings.processing.workers
        self.method = settings.processing.method
        self.ahead = windows_ahead(self.workers, settings.samples_per_rank * settings.plan.window_size)
        spec = settings.collator.vision_fields.get(PIXELS)  # (row shape, dtype): what a micro-batch's buffer holds
        self._pixels = (tuple(spec[0]), spec[1]) if spec is not None else None
        self._pool: Executor | None = None
        self._buffers = BufferPool()  # micro-batch pixel buffers, used again once their micro-batch is gone
        self._segments = SegmentPool(os.getpid())  # the same, in shared memory, for worker processes
        self._gathering: ThreadPoolExecutor | None = None
        self._pending: collections.deque[_Pending] = collections.deque()
        self.describe({"module fields": settings.fields.role, **collation_settings(settings.collator)})

    def discard_ahead(self) -> None:
        self._drop_pending()

    def restore(self, initial_state: dict | None) -> None:
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        self._source_ended = False

    def next(self) -> Window:
        try:
            if not self._source_ended:
                end = fill_ahead(self.source, self._pending, self.ahead, self._submit)
                if end is not None:
                    self._source_ended = True
                    self._agree_at_end(end)
            if not self._pending:
                raise StopIteration
            pending = self._pending.popleft()
            window = pending.window.result()
        except StopIteration:
            raise
        except BaseException:
            self._drop_pending()
            raise  # the loader tells the nodes before this one (the exchange announces it to its peers)
        self._state_after_delivered = pending.state_after
        window.record = pending.record  # reported by the node that hands the window to the consumer
        return window

    def _agree_at_end(self, end: StopIteration) -> None:
        """The source ended: with a :class:`~mimo_pipes.nodes.module_end.ModuleEnd` (a module's exchange), every
        window still pending is processed first and whether any failed is agreed on with the module's other
        ranks, so a row failing after the last exchange fails every rank, not its own alone. At the same point of
        the stream on every rank (where the end is read), whatever each rank's failures."""
        if not isinstance(end, ModuleEnd):
            return
        error = None
        for pending in self._pending:
            try:
                pending.window.result()
            except BaseException as failure:  # noqa: BLE001 - agreed on, then raised (by agree itself)
                error = failure
                break
        end.agree(error)

    def processed_ahead(self) -> list[Window]:
        """The windows processed and not yet handed out (what this node holds beyond the consumer)."""
        pending = tuple(self._pending)  # one step under the GIL: safe beside the consumer's thread
        return [p.window.result() for p in pending if p.window.done() and not p.window.cancelled() and p.window.exception() is None]

    def _submit(self, window: Window, state_after: Any) -> _Pending:
        pool, gathering = self._executors()
        if self.method == "thread":
            if isinstance(self.process, StartsFetches):
                for microbatch in window.microbatches:
                    for row in microbatch:
                        self.process.start_fetches(row)
            rows = [self._submit_into(pool, microbatch) for microbatch in window.microbatches]
        else:
            rows = [self._submit_placed(pool, microbatch) for microbatch in window.microbatches]
        dropped = threading.Event()
        if self.masking is None:
            processed = gathering.submit(_gathered, window, rows)
        else:
            processed = gathering.submit(self._masked, window, rows, dropped)
        return _Pending(processed, [future for microbatch in rows for future in microbatch], state_after, window.record, dropped)

    def _counts(self, microbatch: list[Sample]) -> list[int | None] | None:
        """Each row's pixel rows as its count tells them (None where it cannot); None when no row's is known."""
        if not isinstance(self.process, CountsRows) or self._pixels is None:
            return None
        counts = [self.process.counted_rows(row) for row in microbatch]
        return counts if any(counts) else None

    def _submit_into(self, pool: Executor, microbatch: list[Sample]) -> list[Future[Sample]]:
        """A micro-batch's rows to worker threads, each copying its pixels into its slice of one buffer made for the
        micro-batch: the copy runs on the workers (torch lets the GIL go), and collation takes the slices, in order,
        as the buffer itself (:func:`~mimo_pipes.samples.collate.lend_rows`) instead of concatenating them on the
        thread that hands micro-batches out (the one serial copy of every pixel a micro-batch had)."""
        counts = self._counts(microbatch)
        if counts is None:
            return [_placing(pool.submit(self.process, row), None) for row in microbatch]
        assert self._pixels is not None
        tail, dtype = self._pixels
        width = math.prod(tail)
        sizes = [count or 0 for count in counts]
        buffer = self._buffers.take(sum(sizes) * width, dtype)  # not filled here: each worker writes its own part
        lend_rows(buffer)
        starts = itertools.accumulate(sizes, initial=0)
        return [_placing(pool.submit(_process_into, self.process, row, buffer[start * width:(start + size) * width].view(size, *tail) if size else None), None)
                for row, start, size in zip(microbatch, starts, sizes)]

    def _submit_placed(self, pool: Executor, microbatch: list[Sample]) -> list[Future[Sample]]:
        """A micro-batch's rows to worker processes, each told where its pixels go in the micro-batch's buffer
        (:class:`~mimo_pipes.samples.handover.Destination`) when its count tells how many there are."""
        counts = self._counts(microbatch)
        if counts is None:
            return [_placing(pool.submit(_process_installed, row, None), None, on_process=True) for row in microbatch]
        assert self._pixels is not None
        try:
            destination = handover.Destination(os.getpid(), [count or 0 for count in counts], *self._pixels, pool=self._segments)
        except OSError:  # no room in shared memory: each sample hands its own over
            return [_placing(pool.submit(_process_installed, row, None), None, on_process=True) for row in microbatch]
        futures = []
        for row, count, place, rows in zip(microbatch, counts, destination.places, destination.rows):
            future = _placing(pool.submit(_process_installed, row, place if count else None), rows, on_process=True)
            future.add_done_callback(destination.row_done)
            futures.append(future)
        return futures

    def _masked(self, window: Window, rows: list[list[Future[Sample]]], dropped: threading.Event) -> Window:
        """On the rows thread, in window order: the window's rows processed, the job's failures agreed on
        (also for a dropped window: its peers join the same agreement), the failed samples masked."""
        assert self.masking is not None
        failed: dict[tuple[int, int], str] = {}
        fatal: BaseException | None = None
        samples: list[list[Sample]] = []
        for microbatch, futures in zip(window.microbatches, rows):
            samples.append([])
            for row, future in zip(microbatch, futures):
                try:
                    samples[-1].append(_result(future))
                except CancelledError:
                    continue  # the window was dropped
                except SampleError as error:
                    position = _position(row)
                    if position is None:
                        fatal = fatal or error
                        continue
                    failed[position] = _one_line(error)
                    try:  # made before the agreement, so that a stand-in that fails stops every rank alike
                        samples[-1].append(self.masking.stand_in(row))
                    except BaseException as stand_in_error:  # noqa: BLE001 - every rank stops
                        fatal = fatal or stand_in_error
                except BaseException as error:  # noqa: BLE001 - not the row's fault: every rank stops
                    fatal = fatal or error
        said = agree_on_failures(self.masking.group, window.first_step, tuple((step, sid, why) for (step, sid), why in failed.items()),
                                 None if fatal is None else _one_line(fatal))
        if fatal is not None:
            raise fatal
        stopped = next((rank for rank in said if rank.fatal is not None), None)
        if stopped is not None:
            raise PeerError(stopped.rank, f"processing the window at step {window.first_step} stopped: {stopped.fatal}")
        if dropped.is_set():
            return window
        reasons = {(step, sid): why for rank in said for step, sid, why in rank.failed}
        self.masked += mask_failed(samples, reasons)
        return Window(window.first_step, samples, composition=window.composition)

    def _executors(self) -> tuple[Executor, ThreadPoolExecutor]:
        if self._pool is None or self._gathering is None:
            self._buffers.reopen()
            self._segments.reopen()
            if self.method == "thread":
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="mimo-pipes-process", initializer=serial_torch_here)
            else:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=worker_context(), initializer=_install, initargs=(self.process,))
            # A window waits for its rows (and, with masking, agrees on their failures) on a thread of its own, so
            # the pool's workers never wait behind a window.
            self._gathering = ThreadPoolExecutor(1, thread_name_prefix="mimo-pipes-rows")
        return self._pool, self._gathering

    def _drop_pending(self) -> None:
        for pending in self._pending:
            for future in pending.rows:
                future.cancel()
            pending.dropped.set()
            if self.masking is None:  # with masking the window's agreement still runs: its peers join it
                pending.window.cancel()
        self._pending.clear()

    def shutdown(self) -> None:
        """Stop the workers after the rows they are processing; pending windows are dropped."""
        self._drop_pending()
        pool, gathering = self._pool, self._gathering
        self._pool = self._gathering = None
        self._buffers.clear()
        self._segments.clear()
        if pool is not None and gathering is not None:
            _shut_down(pool, gathering, self.masking is None)

    def source_state(self) -> Any:
        return self._state_after_delivered


def _gathered(window: Window, rows: list[list[Future[Sample]]]) -> Window:
    """The window's processed rows; its composition (who holds which micro-batch) kept."""
    processed = [[_result(future) for future in microbatch] for microbatch in rows]
    return Window(window.first_step, processed, composition=window.composition)


def _process_into(process: Callable[[Sample], Sample], row: Sample, target: torch.Tensor | None) -> Sample:
    """On a worker thread: the row processed, its pixels in ``target`` (its slice of the micro-batch's buffer: laid
    out there by the pixel table where it takes the offer, else copied) and replaced by it, when they have exactly
    the shape and dtype counted; else the sample as it is."""
    offered = target.numpy() if target is not None and target.dtype == torch.float32 else None  # what fast_pixels lays out
    with pixels_into(offered):  # pixels laid out by fast_pixels land there directly
        sample = process(row)
    value = sample.get(PIXELS)
    if target is None or not isinstance(value, torch.Tensor) or value.shape != target.shape or value.dtype != target.dtype:
        return sample
    if value.data_ptr() != target.data_ptr():  # made elsewhere (the image processor's own path): copied once
        target.copy_(value)
    sample[PIXELS] = target
    return sample


def _placing(future: Future[Any], rows: Any, *, on_process: bool = False) -> Future[Sample]:
    """``future`` with the rows of the micro-batch's buffer its worker process writes its pixels into (None: none;
    worker threads place theirs themselves), read back by :func:`_result`; ``on_process``: its result is
    :func:`_process_installed`'s (the sample and the warnings its worker process recorded)."""
    future.placed_rows = rows  # type: ignore[attr-defined]
    future.on_process = on_process  # type: ignore[attr-defined]
    return future


def _result(future: Future[Sample]) -> Sample:
    """A row's sample; its pixels, when its worker placed them, as its rows of the micro-batch's buffer; the
    warnings a worker process recorded making it counted on this process (the rank's tally, its run summary)."""
    rows = future.placed_rows  # type: ignore[attr-defined] - every row's future is made by _placing
    sample = future.result()
    if future.on_process:  # type: ignore[attr-defined]
        sample = replayed(sample)
    return sample if rows is None else handover.received_rows(sample, PIXELS, rows)


def _shut_down(pool: Executor, gathering: ThreadPoolExecutor, cancel_gathering: bool) -> None:
    workers = list(pool._processes or ()) if isinstance(pool, ProcessPoolExecutor) else []  # its worker processes' ids
    pool.shutdown(wait=True, cancel_futures=True)
    for worker in workers:  # every result has been received: what a worker left named is a hand-over it died in
        handover.sweep(os.getpid(), worker)
    # With masking every window read is agreed on, dropped or not: its peers wait for this rank in it.
    gathering.shutdown(wait=True, cancel_futures=cancel_gathering)


def _position(row: Sample) -> tuple[int, int] | None:
    """A row's place in the global order, as every module knows it: (read step, sample id)."""
    try:
        return operator.index(row.get(STEP)), operator.index(row.get(SAMPLE_ID))
    except TypeError:
        return None


def _one_line(error: BaseException) -> str:
    """Why a row failed, one line: a SampleError's reason (the report names the row), else the error's type and text."""
    if isinstance(error, SampleError):
        return row_reason(error)
    return " ".join(f"{type(error).__name__}: {error}".split())[:MAX_REASON]


_installed: WarningsRecorded | None = None


def _install(process: Callable[[Sample], Sample]) -> None:
    """Worker process set-up: the processing function arrives once, not with every row, and runs with its warnings
    recorded for the rank; torch's operations on one thread (see
    :func:`~mimo_pipes.samples.worker_start.one_thread_per_worker`)."""
    global _installed
    _installed = WarningsRecorded(process)
    one_thread_per_worker()


def _process_installed(row: Sample, place: handover.Placed | None) -> tuple[Sample, Recorded]:
    """In a worker process: the row processed, its pixels written where ``place`` says (if anywhere): laid out
    there by the pixel table where it takes the offer (as on worker threads), else copied there; with the
    warnings processing it raised, recorded for the rank to count (:func:`_result`)."""
    assert _installed is not None
    target = handover.place_target(place) if place is not None else None
    with pixels_into(target if target is not None and target.dtype == np.float32 else None):
        sample, seen = _installed(row)
    return handover.placed(sample, PIXELS, place, target), seen
