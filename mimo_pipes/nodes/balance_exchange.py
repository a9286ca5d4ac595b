"""BalanceExchange: balances each window over the module's DP ranks, optionally prefetching on a thread."""

from __future__ import annotations

import collections
import contextlib
import copy
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from torchdata.nodes import BaseNode, IterableWrapper

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, collation_settings, valid_for
from mimo_pipes.exchange import (
    ExchangeContext,
    RankLayout,
    announce_end,
    announce_failure,
)
from mimo_pipes.nodes.exchange_prefetch import Prefetched, Prefetcher, stop_prefetcher
from mimo_pipes.nodes.window_exchange import ExchangeStart, Receipt, WindowExchange
from mimo_pipes.observe.metrics import MetricsAccumulator
from mimo_pipes.observe.observer import ExchangeObserver, ExchangeRecord
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Window
from mimo_pipes.settings.tail_settings import TailSettings


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
        self._sync_exchange: WindowExchange | None = None  # built at reset, with the start
        self._prefetcher: Prefetcher | None = None
        self._finalizer: weakref.finalize | None = None
        self.start = ExchangeStart()  # see expect_start()
        self._start_sequence = 0  # where a fresh start (reset(None)) begins; start_at() moves it
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
        continues; the metric totals start again there, see :mod:`mimo_pipes.observe.metrics`). Where it starts and
        which micro-batches the window keeps (``point.composition``) the loader then says through
        :meth:`expect_start`, as for every start."""
        saved = saved_state if isinstance(saved_state, dict) else {}
        self._start_sequence = int(saved.get(self.SEQUENCE_KEY, 0))

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
        # A state saved before the totals were kept (no METRICS_KEY) restores the stream and starts them at zero;
        # so does a start on another layout (totals over two layouts' DP ranks would mix figures of different sizes).
        self._accumulator.load_state(None if initial_state is None else initial_state.get(self.METRICS_KEY))
        self._last_metrics = None
        self._unconfirmed.clear()
        self._sync_exchange = WindowExchange(self.ctx, self.collator, self, self.start, self.copy_received)

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
            self._prefetcher = Prefetcher(self.source, WindowExchange(self.ctx, self.collator, self, self.start, self.copy_received), self._sequence)
            self._finalizer = weakref.finalize(self, stop_prefetcher, self._prefetcher, 0)
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
        result.receipt = Receipt(self)
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
        result.receipt = Receipt(self)
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
