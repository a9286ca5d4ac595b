"""BalanceExchange: balances each window over the module's DP ranks, optionally prefetching on a thread."""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from torchdata.nodes import BaseNode, IterableWrapper

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import collation_settings
from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.exchange import (
    AFTER_EXCHANGE,
    ExchangeContext,
    RankLayout,
    announce_end,
    announce_failure,
)
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.exchange_prefetch import ExchangePrefetchThread, Prefetched
from mimo_pipes.nodes.module_end import ModuleEnd
from mimo_pipes.nodes.window_exchange import ExchangeReport, ExchangeStart, WindowExchange
from mimo_pipes.observe.metrics import MetricsAccumulator
from mimo_pipes.observe.observer import ExchangeObserver, ExchangeRecord
from mimo_pipes.samples.checks import check_collatable
from mimo_pipes.samples.sample import Window

ANNOUNCEMENT_WAIT_S = 5.0
"""How long stopping after a failure waits for the prefetch thread's announcement of it to end."""


class BalanceExchange(GraphNode[Window]):
    """Per window: all-gather costs over the DP group, one balanced assignment, one ragged all_to_all.

    Wraps any BaseNode (or plain iterator) of :class:`Window`. ``layout`` is this rank's place in its
    module; B/d, W, the planner's settings, overlap and collation come from ``settings``. With overlap the
    next windows are exchanged on a background thread (:class:`ExchangePrefetchThread`) over
    ``layout.exchange_group``, which must be a group used for nothing else; :meth:`shutdown` stops it, as does
    collecting the node. DP size 1 permutes locally on the calling thread. It only exchanges: received samples
    are unpacked as copies (its byte buffers are reused), and the windows it hands on are collated after it
    (:class:`~mimo_pipes.nodes.window_collator.WindowCollator`); with ``views_until_next`` and no overlap (the
    node after it copies each window out before it asks for the next: a collator in place) they stay views
    of the receive buffer, which saves the copy on the training thread. With ``collatable`` (default; not for rows,
    which are processed first) this rank's samples are checked for that collation before the exchange
    (:func:`~mimo_pipes.samples.checks.check_collatable`), so a bad sample fails on the rank that read it.
    Every exchange carries where the loader started (:meth:`start_at`), so ranks of a module that start from
    different points are refused. A failure after this node (:meth:`abort`, from the loader: a window that
    cannot be processed or collated) is announced in place of the next exchange, so the module's other ranks
    raise too, naming the rank, the cause and that it failed after the exchange. With ``agree_after_end`` (the node
    after it processes rows: RowProcessor, which still works on the last windows once every exchange is done) its
    end is a :class:`~mimo_pipes.nodes.module_end.ModuleEnd`: one more agreement on the same group, after those
    windows are processed (or in :meth:`abort`, where the failure came first), so such a failure fails every rank too.

    The state is the source's state after the last delivered window: plain counters, never samples, the
    windows delivered and the metrics' running totals (a few counts and sums), so cumulative figures continue
    across a resume. It is valid for one DP layout, B/d, W, across-micro-batch setting and the collation its
    samples are checked for; with overlap or without, the state is the same (but for the metrics' time totals).

    Each delivered window is described by an :class:`~mimo_pipes.observe.observer.ExchangeRecord` handed to
    ``observers`` (on the training thread, in order), and with ``collect_metrics`` (default) its
    :mod:`mimo_pipes.observe.metrics` figures are :meth:`metrics` (cumulative since the start of training).
    Neither costs a collective. With ``report_on_delivery`` False (in the graph's tail, whose window collator
    reads ahead of the consumer) the window carries its record instead (``Window.record``) and the node that
    hands it to the consumer reports it to :attr:`report`, so figures follow the consumer.
    """

    SEQUENCE_KEY = "windows_delivered"
    # The totals live here rather than beside a checkpoint: whoever saves the graph's state (the CLI, a
    # StatefulDataLoader, a trainer's own checkpoint) keeps them, and they always match the state's window
    # position. Mid-window, MicroBatchAssembler holds this node's state from before the window, whose totals
    # exclude it; the restored graph delivers that window again and adds it once.
    METRICS_KEY = "metrics_totals"

    def __init__(
        self,
        source: BaseNode[Window] | Iterator[Window],
        *,
        settings: TailSettings,
        layout: RankLayout,
        collatable: bool = True,
        collect_metrics: bool = True,
        observers: Sequence[ExchangeObserver] = (),
        report_on_delivery: bool = True,
        views_until_next: bool = False,
        agree_after_end: bool = False,
    ) -> None:
        super().__init__(source if isinstance(source, BaseNode) else IterableWrapper(source))
        self.ctx = ctx = ExchangeContext.for_rank(layout, settings)
        self.collator = settings.collator if collatable else None
        self.overlap = settings.plan.overlap and ctx.dp_size > 1
        self.report = ExchangeReport(list(observers), collect_metrics)
        self.report_on_delivery = report_on_delivery
        # Received samples stay views of the reused receive buffer only where the node after it is done with each
        # window before it asks for the next (a collator in place) and no thread exchanges ahead; else copies.
        self.copy_received = not views_until_next or self.overlap
        self._accumulator = MetricsAccumulator()
        self._sync_exchange: WindowExchange | None = None  # built at reset, with the start
        self._prefetcher: ExchangePrefetchThread | None = None
        self.start = ExchangeStart()  # see start_at()
        self._start_sequence = 0  # where a fresh start (reset(None)) begins; start_at() moves it
        self._ended = self._failed = False
        self.agree_after_end = agree_after_end
        self._end_sequence: int | None = None  # the exchange sequence the end was agreed at (None: not ended)
        self._agreed_after_end = False
        self._agreement = threading.Lock()  # the agreement after the end: once, from the rows' thread or abort()
        self.describe({
            "dp rank": ctx.dp_rank,
            "dp size": ctx.dp_size,
            "canonical grid size": ctx.grid_size,
            "micro-batch size per rank": ctx.samples_per_rank,
            "window size": ctx.window_size,
            "reorder across micro-batches": ctx.across_microbatches,
            **(collation_settings(self.collator) if self.collator is not None else {"collation": None}),
        })

    @property
    def collect_metrics(self) -> bool:
        """Whether windows' metrics are computed (read per window: may be switched while iterating)."""
        return self.report.collect_metrics

    @collect_metrics.setter
    def collect_metrics(self, value: bool) -> None:
        self.report.collect_metrics = value

    @property
    def observers(self) -> list[ExchangeObserver]:
        return self.report.observers

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next reset on, every exchange carries ``point.consumed_microbatches``; with a
        ``point.composition`` (flat window indices per micro-batch, see :class:`~mimo_pipes.samples.sample.Window`)
        the window at ``point.first_step`` is exchanged with those micro-batches, only balancing each over the
        slots: a window started inside, whose first micro-batches were consumed under that composition.
        ``saved_state``: this node's state saved under another layout at the start of that window (its
        windows-delivered count continues; the metric totals start again there, see :mod:`mimo_pipes.observe.metrics`)."""
        composition = point.composition
        pinned = None if composition is None else (point.first_step, [list(map(int, m)) for m in composition])
        self.start = ExchangeStart(point.consumed_microbatches, pinned)
        saved = saved_state if isinstance(saved_state, dict) else {}
        self._start_sequence = int(saved.get(self.SEQUENCE_KEY, 0))

    def discard_ahead(self) -> None:
        self.shutdown()  # the thread reads the source: stopped before the source is reset

    def restore(self, initial_state: dict | None) -> None:
        self._failed = self._ended = self._agreed_after_end = False
        self._end_sequence = None
        self._sequence = self._start_sequence if initial_state is None else int(initial_state[self.SEQUENCE_KEY])
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        # A state saved before the totals were kept (no METRICS_KEY) restores the stream and starts them at zero;
        # so does a start on another layout (totals over two layouts' DP ranks would mix figures of different sizes).
        self._accumulator.load_state(None if initial_state is None else initial_state.get(self.METRICS_KEY))
        self.report.last_metrics = None
        self._sync_exchange = self._window_exchange()

    def _window_exchange(self) -> WindowExchange:
        """One exchanging thread's step (each thread its own buffers)."""
        collator = self.collator
        check = None if collator is None else functools.partial(
            check_collatable, pad_length=collator.pad_length, vision_fields=collator.vision_fields)
        return WindowExchange(self.ctx, check, self.report, self.start, copy=self.copy_received)

    def add_observer(self, observer: ExchangeObserver) -> None:
        """Call ``observer`` with the record of every window delivered from now on."""
        self.report.observers.append(observer)

    def metrics(self) -> dict[str, Any] | None:
        """The last delivered window's metrics (see :mod:`mimo_pipes.observe.metrics`), cumulative figures included;
        None before the first window or while ``collect_metrics`` is off."""
        return self.report.last_metrics

    def prefetched(self) -> Prefetched:
        """Windows the overlapped exchange holds ahead of the consumer now (zeros when not overlapped)."""
        prefetcher = self._prefetcher
        return Prefetched(0, 0) if prefetcher is None else prefetcher.prefetched()

    def prefetched_windows(self) -> list[Window]:
        """The windows the overlapped exchange holds ahead of the consumer now (exchanged, not delivered)."""
        prefetcher = self._prefetcher
        return prefetcher.queued_windows() if prefetcher is not None else []

    def _deliver(self, window: Window, record: ExchangeRecord | None, wait_seconds: float) -> Window:
        self._sequence += 1
        if record is not None:
            record.wait_seconds = wait_seconds
            if record.metrics is not None:  # the totals follow delivery, as the state does
                record.metrics = self._accumulator.add(record.metrics, wait_seconds)
        if self.report_on_delivery:
            self.report.publish(record)
        else:
            window.record = record
        return window

    def next(self) -> Window:
        if self._ended:
            raise StopIteration
        try:
            return self._next_overlapped() if self.overlap else self._next_synchronous()
        except BaseException:
            self._ended = True  # every rank raises it already: announcing it again would wait for peers that never come
            raise

    def _next_overlapped(self) -> Window:
        if self._prefetcher is None:
            self._prefetcher = ExchangePrefetchThread(self.source, self._window_exchange(), self._sequence)
        waiting = time.perf_counter()
        try:
            (result, record), state_after = self._prefetcher.take()
        except StopIteration:
            ended_at = self._prefetcher.ended_at
            self.shutdown()
            raise self._end(ended_at) from None
        except BaseException:  # a failure every rank of the module raises
            self.shutdown()
            raise
        waited = time.perf_counter() - waiting
        self._state_after_delivered = state_after
        return self._deliver(result, record, waited)

    def _next_synchronous(self) -> Window:
        try:
            window = next(self.source)
        except StopIteration:
            announce_end(self.ctx, self._sequence)
            raise self._end(self._sequence) from None
        except Exception as error:  # noqa: BLE001 - made an exception on every rank
            announce_failure(self.ctx, self._sequence, error)
        assert self._sync_exchange is not None, "reset() builds the exchange"
        result, record = self._sync_exchange(window, self._sequence, on_training_thread=True)
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        # On the training thread the exchange itself is the wait.
        return self._deliver(result, record, record.exchange_seconds if record is not None else 0.0)

    def _end(self, sequence: int | None) -> StopIteration:
        """The end, agreed at exchange ``sequence``: with ``agree_after_end`` a ModuleEnd owing the last agreement."""
        if not self.agree_after_end or sequence is None:
            return StopIteration()
        self._end_sequence = sequence
        return ModuleEnd(self._agree_after_end)

    def _agree_after_end(self, error: BaseException | None) -> None:
        """The module's last agreement, once per end (from the rows' node, or :meth:`abort`), on the exchange's group
        after its last exchange (the prefetch thread has ended by then: no two threads issue collectives on it):
        raises ``error`` itself, or a PeerError naming the rank whose processing failed."""
        with self._agreement:
            if self._end_sequence is None or self._agreed_after_end:
                return
            self._agreed_after_end = True
        if error is None:
            announce_end(self.ctx, self._end_sequence + 1)
        else:
            announce_failure(self.ctx, self._end_sequence + 1, error, AFTER_EXCHANGE)

    def abort(self, error: BaseException) -> None:
        """A failure after this node (processing a window it delivered, say; the loader tells it) becomes an
        exception on every rank of the module: the rank announces it in place of its next exchange, so its
        peers raise PeerError there (within the windows already prefetched) instead of waiting in that
        exchange; after the end (``agree_after_end``), in the agreement after it. Nothing when this node's own
        stream already failed, or ended without that agreement (every rank knows then)."""
        if not self._ended:
            self._ended = self._failed = True
            if self._prefetcher is not None:
                self._prefetcher.fail(error)
                # Its thread may have agreed on the end before the failure reached it: the failure is then told in
                # the agreement after the end, once the thread has ended.
                if self.agree_after_end and self._prefetcher.end_agreed(ANNOUNCEMENT_WAIT_S):
                    self._end_sequence = self._prefetcher.ended_at
            else:
                with contextlib.suppress(BaseException):  # raises ``error`` itself
                    announce_failure(self.ctx, self._sequence, error, AFTER_EXCHANGE)
        with contextlib.suppress(BaseException):  # raises ``error`` itself
            self._agree_after_end(error)

    def shutdown(self, join_timeout: float | None = None) -> None:
        """Stop the prefetch thread after the exchanges peers may depend on; joins it (None: no limit)."""
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            # After a failure the thread's last collective is the announcement, which ends once the peers reach
            # it: at once when their threads exchange ahead, as they do while their trainers run. A peer held
            # elsewhere (in its trainer's all-reduce with this rank) would keep it to the group's timeout: waited
            # for a few seconds only, so this rank's own error is never held back longer.
            wait = ANNOUNCEMENT_WAIT_S if join_timeout is None else min(join_timeout, ANNOUNCEMENT_WAIT_S)
            prefetcher.stop(wait if self._failed else join_timeout)

    def __del__(self) -> None:
        # A node dropped without shutdown(): its thread holds no reference to it, so this runs; stop the thread
        # without waiting (the peers drop theirs at the same point).
        try:
            prefetcher = self._prefetcher
        except AttributeError:  # __init__ failed before the thread could exist
            return
        if prefetcher is not None:
            prefetcher.stop(0)

    def source_state(self) -> Any:
        return self._state_after_delivered

    def own_state(self) -> dict[str, Any]:
        return {self.SEQUENCE_KEY: self._sequence, self.METRICS_KEY: self._accumulator.state()}
