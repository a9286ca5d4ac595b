"""One window's exchange as the balance exchange's threads run it, where it starts, and a delivered window's receipt."""

from __future__ import annotations

import time
import weakref
from typing import NamedTuple, Protocol

from mimo_pipes.exchange import ExchangeBuffers, ExchangeContext, agree_after_exchange, exchange_window
from mimo_pipes.observe.metrics import window_metrics
from mimo_pipes.observe.observer import ExchangeRecord
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Window, held_bytes


class Delivering(Protocol):
    """What a window's exchange and its receipt ask of the node that delivers the window (the balance exchange)."""

    collect_metrics: bool
    observers: list

    def confirm(self) -> None: ...

    def fail(self, error: BaseException) -> None: ...

class ExchangeStart(NamedTuple):
    """Where the loader over this node started or restored: the consumed micro-batches (-1: not known), which
    every exchange carries so that ranks of a module restored from different saves are refused; and the
    window whose micro-batches a saved run chose, as (first step, composition), or None."""

    consumed_microbatches: int = -1
    pinned: tuple[int, list[list[int]]] | None = None


class Receipt:
    """A delivered window's receipt (see :class:`~mimo_pipes.samples.sample.WindowReceipt`): its metrics follow
    the window handed on, and a failure with it reaches the module's ranks. Weak: a window kept by the
    consumer never keeps the node alive."""

    def __init__(self, node: Delivering) -> None:
        self.node = weakref.ref(node)

    def delivered(self) -> None:
        node = self.node()
        if node is not None:
            node.confirm()

    def failed(self, error: BaseException) -> None:
        node = self.node()
        if node is not None:
            node.fail(error)


class WindowExchange:
    """One exchanging thread's step: the exchange, then (optionally) collation, with its own buffers.
    Records what it did when the node collects metrics or has observers (the window's metrics are
    computed here, on the exchanging thread, off the training thread when overlapped)."""

    def __init__(self, ctx: ExchangeContext, collator: Collator | None, node: Delivering, start: ExchangeStart,
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
