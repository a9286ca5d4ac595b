"""BalanceExchange: balances each window over the module's DP ranks, optionally prefetching on a thread."""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torchdata.nodes import BaseNode, IterableWrapper

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, collation_settings, valid_for
from mimo_pipes.exchange import (
    ExchangeBuffers,
    ExchangeContext,
    RankLayout,
    agree_after_exchange,
    announce_end,
    announce_failure,
    exchange_window,
)
from mimo_pipes.graph.tail_settings import TailSettings
from mimo_pipes.observe.metrics import MetricsAccumulator, window_metrics
from mimo_pipes.observe.observer import ExchangeObserver, ExchangeRecord
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Window, held_bytes

# Windows exchanged ahead of the consumer. Every rank's thread runs at most this far ahead, which bounds
# memory (two extra windows per rank) and tells a stopping thread which exchanges its peers may have begun.
PREFETCH_DEPTH = 2


class Prefetched(NamedTuple):
    """Windows an overlapped exchange holds ahead of the consumer."""

    queued: int  # exchanged, not yet delivered
    in_flight: int  # being exchanged on the prefetch thread now (0 or 1)


class ExchangeStart(NamedTuple):
    """Where the loader over this node started or restored: the consumed micro-batches (-1: not known), which
    every exchange carries so that ranks of a module restored from different saves are refused; and the
    window whose micro-batches a saved run chose, as (first step, composition), or None."""

    consumed_microbatches: int = -1
    pinned: tuple[int, list[list[int]]] | None = None


class _Receipt:
    """A delivered window's receipt (see :class:`~mimo_pipes.samples.sample.WindowReceipt`): its metrics follow
    the window handed on, and a failure with it reaches the module's ranks. Weak: a window kept by the
    consumer never keeps the node alive."""

    def __init__(self, node: BalanceExchange) -> None:
        self.node = weakref.ref(node)

    def delivered(self) -> None:
        node = self.node()
        if node is not None:
            node.confirm()

    def failed(self, error: BaseException) -> None:
        node = self.node()
        if node is not None:
            node.fail(error)


class _Prefetcher:
    """Background exchanges on a dedicated group. Stops cooperatively: it finishes the exchanges any peer
    may already have entered (up to ``delivered + PREFETCH_DEPTH``), so no peer is left in a collective."""

    def __init__(self, source: BaseNode[Window], exchange: _WindowExchange, first_sequence: int) -> None:
        self.source = source
        self.exchange = exchange
        self.condition = threading.Condition()
        self.results: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self.produced = 0
        self.delivered = 0
        self.first_sequence = first_sequence
        self.stopping = False
        self.failure: BaseException | None = None  # a failure after delivery: announced in place of the next exchange
        self.in_flight = 0
        self.thread = threading.Thread(target=self._run, name="mimo-pipes-exchange", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        device = self.exchange.ctx.device
        if device is not None and device.type == "cuda":
            torch.cuda.set_device(device)  # the current CUDA device is per thread
        while True:
            with self.condition:
                while not self.stopping and self.failure is None and self.produced >= self.delivered + PREFETCH_DEPTH:
                    self.condition.wait()
                failure = self.failure
                if failure is None and self.produced >= self.delivered + PREFETCH_DEPTH:
                    return
            sequence = self.first_sequence + self.produced
            if failure is not None:
                with contextlib.suppress(BaseException):  # raises the failure itself, here already known
                    announce_failure(self.exchange.ctx, sequence, failure)
                return
            try:
                try:
                    window = next(self.source)
                except StopIteration:
                    announce_end(self.exchange.ctx, sequence)
                    self._publish("end", None, None)
                    return
                except Exception as error:  # noqa: BLE001 - made an exception on every rank
                    announce_failure(self.exchange.ctx, sequence, error)
                state_after = copy.deepcopy(self.source.state_dict())
                self.in_flight = 1
                try:
                    result = self.exchange(window, sequence, on_training_thread=False)
                finally:
                    self.in_flight = 0
            except BaseException as error:  # noqa: BLE001 - handed to the consumer thread
                self._publish("error", error, None)
                return
            self._publish("window", result, state_after)

    def _publish(self, kind: str, value: Any, state: Any) -> None:
        with self.condition:
            self.produced += 1
            self.results.append((kind, value, state))
            self.condition.notify_all()

    def take(self) -> tuple[str, Any, Any]:
        with self.condition:
            while not self.results:
                if not self.thread.is_alive():
                    raise RuntimeError("exchange thread ended without a result")
                self.condition.wait(timeout=1.0)
            item = self.results.popleft()
            if item[0] == "window":
                self.delivered += 1
            self.condition.notify_all()
            return item

    def queued_windows(self) -> list[Any]:
        with self.condition:
            return [value[0] for kind, value, _ in self.results if kind == "window"]

    def fail(self, error: BaseException) -> None:
        with self.condition:
            self.failure = error
            self.condition.notify_all()

    def stop(self, join_timeout: float | None) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        if join_timeout is None or join_timeout > 0:
            self.thread.join(join_timeout)


def _stop_prefetcher(prefetcher: _Prefetcher | None, join_timeout: float | None) -> None:
    if prefetcher is not None:
        prefetcher.stop(join_timeout)


class _WindowExchange:
    """One exchanging thread's step: the exchange, then (optionally) collation, with its own buffers.
    Records what it did when the node collects metrics or has observers (the window's metrics are
    computed here, on the exchanging thread, off the training thread when overlapped)."""

    def __init__(self, ctx: ExchangeContext, collator: Collator | None, node: BalanceExchange, start: ExchangeStart,
                 copy_received: bool = False) -> None:
        self.ctx = ctx
        self.start = start
        self.collator = collator
        self.copy_received = copy_received
        # Weak: a strong reference from the prefetch thread would keep the node, and so its thread, alive. Read
        # for what the consumer may change while windows are exchanged: metric collection and observers.
        self.node = weakref.ref(node)
        # Buffers can be reused only when nothing received keeps a view of them: collation copies the
        # samples out right away, or they are unpacked as copies.
        self.buffers = ExchangeBuffers() if collator is not None or copy_received else None

    def __call__(self, window: Window, sequence: int, on_training_thread: bool) -> tuple[Window, ExchangeRecord | None]:
        node = self.node()
        collect = node is not None and node.collect_metrics
        record = None
        if collect or (node is not None and node.observers):
            ctx = self.ctx
            record = ExchangeRecord(sequence, window.first_step, ctx.dp_rank, ctx.dp_size, ctx.grid_size,
                                    ctx.across_microbatches, on_training_thread=on_training_thread)
        del node
        position, pinned = self.start.consumed_microbatches, self.start.pinned
        composition = pinned[1] if pinned is not None and pinned[0] == window.first_step else None
        started = time.perf_counter()
        if self.collator is None:
            result = exchange_window(self.ctx, window, sequence, self.buffers, record=record, position=position,
                                     composition=composition, copy=self.copy_received)
        else:
            # What collation needs is checked before the exchange; what still fails is agreed on after it.
            result = exchange_window(self.ctx, window, sequence, self.buffers, validate=self.collator.check, record=record,
                                     position=position, composition=composition)
            collating = time.perf_counter()
            error: Exception | None = None
            try:
                result = self.collator.window(result)
            except Exception as caught:  # noqa: BLE001 - raised on every rank by the agreement
                error = caught
            agree_after_exchange(self.ctx, sequence, error)
            if record is not None:
                record.seconds["collate"] = time.perf_counter() - collating
        if record is not None:
            record.started_at = started
            record.exchange_seconds = time.perf_counter() - started
            record.window_bytes = held_bytes(result)
            if collect:
                record.metrics = window_metrics(record)
        return result, record


class BalanceExchange(BaseNode[Window]):
    """Per window: all-gather costs over the DP group, one balanced assignment, one ragged all_to_all.

    Wraps any BaseNode (or plain iterator) of :class:`Window`. ``layout`` is this rank's place in its
    module; B/d, W, the planner's settings, overlap and collation come from ``settings``. With overlap the
    next windows are exchanged on a background thread over ``layout.exchange_group``, which must be a group
    used for nothing else. DP size 1 permutes locally on the calling thread. With ``collate`` (default)
    each window is also collated right after its exchange, on the same thread, so the training thread only
    hands micro-batches out (without it, :class:`MicroBatchAssembler` collates);
    the samples are checked for it before the exchange, and one small all-gather after collation makes
    a collation failure on any rank an exception on every rank.
    The state is the source's state after the last delivered window: plain counters, never samples, and
    the metrics' running totals (a few counts and sums), so cumulative figures continue across a resume.

    Under the ``rows`` payload it moves rows, unpacked as copies (they are small), and leaves them
    uncollated for :class:`~mimo_pipes.nodes.row_processor.RowProcessor`, which processes them after it
    and reads a window ahead: with ``confirm_delivery`` a window's record reaches the observers and
    :meth:`metrics` when that node hands the window on (:meth:`confirm`), so they follow the consumer;
    :meth:`fail` lets that node's failures reach the module's other ranks.

    Each delivered window is described by an :class:`~mimo_pipes.observe.observer.ExchangeRecord` handed to
    ``observers`` (on the training thread, in order). With ``collect_metrics`` (default) the node also
    keeps :mod:`mimo_pipes.observe.metrics`' figures: :meth:`metrics` is the last delivered window's dict,
    cumulative figures included (since the start of training: a restored state brings its totals).
    Neither costs a collective. It is valid for one DP layout, B/d, W, across-micro-batch setting and
    collation; with overlap or without, the state is the same (but for the metrics' time totals).
    """

    SOURCE_KEY = "source"
    SEQUENCE_KEY = "windows_delivered"
    # The totals live here rather than beside a checkpoint: whoever saves the graph's state (the CLI, a
    # StatefulDataLoader, a trainer's own checkpoint) keeps them, and they always match the state's window
    # position. Mid-window, MicroBatchAssembler holds this node's state from before the window, whose totals
    # exclude it; the restored graph delivers that window again and adds it once.
    METRICS_KEY = "metrics_totals"
    VALID_FOR_KEY = VALID_FOR_KEY

    def __init__(
        self,
        source: BaseNode[Window] | Iterator[Window],
        *,
        settings: TailSettings,
        layout: RankLayout,
        collate: bool = True,
        collect_metrics: bool = True,
        observers: Sequence[ExchangeObserver] = (),
        confirm_delivery: bool = False,
    ) -> None:
        super().__init__()
        self.source = source if isinstance(source, BaseNode) else IterableWrapper(source)
        self.ctx = ctx = ExchangeContext.for_rank(layout, settings)
        self.collator: Collator | None = settings.collator if collate else None
        collator = self.collator
        self.overlap = settings.plan.overlap and ctx.dp_size > 1
        self.collect_metrics = collect_metrics  # read per window: may be switched while iterating
        self.observers: list[ExchangeObserver] = list(observers)
        self._accumulator = MetricsAccumulator()
        self._last_metrics: dict[str, Any] | None = None
        self.confirm_delivery = confirm_delivery
        self._unconfirmed: collections.deque[ExchangeRecord | None] = collections.deque()
        self.copy_received = settings.processing.rows
        self._sync_exchange: _WindowExchange | None = None  # built at reset, with the start
        self._prefetcher: _Prefetcher | None = None
        self._finalizer: weakref.finalize | None = None
        self.start = ExchangeStart()  # see expect_start()
        self._start_sequence = 0  # where a fresh start (reset(None)) begins; start_at() moves it
        self._start_totals: dict[str, Any] | None = None
        self._failed = False
        self.valid_for = valid_for(type(self).__name__, {
            "dp rank": ctx.dp_rank,
            "dp size": ctx.dp_size,
            "canonical grid size": ctx.grid_size,
            "micro-batch size per rank": ctx.samples_per_rank,
            "window size": ctx.window_size,
            "reorder across micro-batches": ctx.across_microbatches,
            **(collation_settings(collator) if collator is not None else {"collation": None}),
        })

    def expect_start(self, consumed_microbatches: int, first_step: int = 0, composition: list[list[int]] | None = None) -> None:
        """From the next reset on: the loader over this node starts at ``consumed_microbatches`` (every exchange
        carries it, so a module's ranks that start from different points are refused), and, with a
        ``composition`` (flat window indices per micro-batch, see :class:`~mimo_pipes.samples.sample.Window`),
        the window at ``first_step`` is exchanged with those micro-batches, only balancing each over the slots:
        a window restored inside, whose first micro-batches were consumed under that composition."""
        pinned = None if composition is None else (int(first_step), [list(map(int, m)) for m in composition])
        self.start = ExchangeStart(int(consumed_microbatches), pinned)

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next ``reset(None)`` on, continue a run saved under another layout at ``point.first_step``:
        ``saved_state`` is this node's state saved at the start of that window (its windows-delivered count
        and the module's metric totals continue, see :meth:`MetricsAccumulator.module_wide`), and
        ``point.composition`` pins the window's micro-batches (:meth:`expect_start`)."""
        saved = saved_state if isinstance(saved_state, dict) else {}
        self._start_sequence = int(saved.get(self.SEQUENCE_KEY, 0))
        self._start_totals = MetricsAccumulator.module_wide(saved.get(self.METRICS_KEY))
        self.expect_start(self.start.consumed_microbatches, point.first_step, point.composition)

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None:
            check_valid_for(initial_state, self.valid_for)
        super().reset(initial_state)
        self.close()
        self._failed = False
        if initial_state is None:
            self.source.reset(None)
            self._sequence = self._start_sequence
        else:
            self.source.reset(copy.deepcopy(initial_state[self.SOURCE_KEY]))
            self._sequence = int(initial_state[self.SEQUENCE_KEY])
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        self._ended = False
        # A state saved before the totals were kept (no METRICS_KEY) restores the stream and starts them at zero.
        self._accumulator.load_state(self._start_totals if initial_state is None else initial_state.get(self.METRICS_KEY))
        self._last_metrics = None
        self._unconfirmed.clear()
        self._sync_exchange = _WindowExchange(self.ctx, self.collator, self, self.start, self.copy_received)

    def add_observer(self, observer: ExchangeObserver) -> None:
        """Call ``observer`` with the record of every window delivered from now on."""
        self.observers.append(observer)

    def metrics(self) -> dict[str, Any] | None:
        """The last delivered window's metrics (see :mod:`mimo_pipes.observe.metrics`), cumulative figures included;
        None before the first window or while ``collect_metrics`` is off."""
        return self._last_metrics

    def prefetched(self) -> Prefetched:
        """Windows the overlapped exchange holds ahead of the consumer now (zeros when not overlapped)."""
        prefetcher = self._prefetcher
        if prefetcher is None:
            return Prefetched(0, 0)
        return Prefetched(len(prefetcher.results), prefetcher.in_flight)

    def prefetched_windows(self) -> list[Window]:
        """The windows the overlapped exchange holds ahead of the consumer now (exchanged, not delivered)."""
        prefetcher = self._prefetcher
        return prefetcher.queued_windows() if prefetcher is not None else []

    def confirm(self) -> None:
        """With ``confirm_delivery`` (a window's receipt calls it): the consumer's node handed on the oldest
        window it read from this node;
        its metrics become :meth:`metrics` and its record goes to the observers now."""
        if self._unconfirmed:
            self._publish(self._unconfirmed.popleft())

    def _deliver(self, record: ExchangeRecord | None, wait_seconds: float) -> None:
        if record is not None:
            record.wait_seconds = wait_seconds
            if record.metrics is not None:  # the totals follow delivery, as the state does
                record.metrics = self._accumulator.add(record.metrics, wait_seconds)
        if self.confirm_delivery:
            self._unconfirmed.append(record)
        else:
            self._publish(record)

    def _publish(self, record: ExchangeRecord | None) -> None:
        if record is None:
            return
        if record.metrics is not None:
            self._last_metrics = record.metrics
        for observer in self.observers:
            observer(record)

    def next(self) -> Window:
        if self._ended:
            raise StopIteration
        if not self.overlap:
            return self._next_synchronous()
        if self._prefetcher is None:
            self._prefetcher = _Prefetcher(self.source, _WindowExchange(self.ctx, self.collator, self, self.start, self.copy_received), self._sequence)
            self._finalizer = weakref.finalize(self, _stop_prefetcher, self._prefetcher, 0)
        waiting = time.perf_counter()
        kind, value, state_after = self._prefetcher.take()
        waited = time.perf_counter() - waiting
        if kind == "end":
            self._ended = True
            self.close()
            raise StopIteration
        if kind == "error":
            self._ended = True
            self.close()
            raise value
        self._sequence += 1
        self._state_after_delivered = state_after
        result, record = value
        self._deliver(record, waited)
        result.receipt = _Receipt(self)
        return result

    def _next_synchronous(self) -> Window:
        try:
            window = next(self.source)
        except StopIteration:
            self._ended = True
            announce_end(self.ctx, self._sequence)
            raise
        except Exception as error:  # noqa: BLE001 - made an exception on every rank
            self._ended = True
            announce_failure(self.ctx, self._sequence, error)
        assert self._sync_exchange is not None, "reset() builds the exchange"
        result, record = self._sync_exchange(window, self._sequence, on_training_thread=True)
        self._sequence += 1
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        # On the training thread the exchange itself is the wait.
        self._deliver(record, record.exchange_seconds if record is not None else 0.0)
        result.receipt = _Receipt(self)
        return result

    def fail(self, error: BaseException) -> None:
        """A failure with a window this node delivered (processing it after the exchange) becomes an exception
        on every rank of the module: the rank announces it in place of its next exchange, so its peers raise
        PeerError there (within the windows already prefetched) instead of waiting in that exchange. The
        caller raises ``error`` itself; this node delivers nothing more."""
        self._ended = True
        self._failed = True
        if self._prefetcher is not None:
            self._prefetcher.fail(error)
        else:
            with contextlib.suppress(BaseException):  # raises ``error`` itself
                announce_failure(self.ctx, self._sequence, error)

    def close(self, join_timeout: float | None = None) -> None:
        """Stop the prefetch thread after the exchanges peers may depend on; joins it (None: no limit)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._prefetcher is not None:
            # After a failure the thread's last collective is the announcement, which ends once the peers
            # reach it (or the group times out): not waited for.
            self._prefetcher.stop(0 if self._failed else join_timeout)
            self._prefetcher = None

    def get_state(self) -> dict[str, Any]:
        return {
            self.VALID_FOR_KEY: copy.deepcopy(self.valid_for),
            self.SOURCE_KEY: copy.deepcopy(self._state_after_delivered),
            self.SEQUENCE_KEY: self._sequence,
            self.METRICS_KEY: self._accumulator.state(),
        }
