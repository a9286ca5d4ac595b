"""One window's exchange as the balance exchange's threads run it, where it starts, and where its record goes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from mimo_pipes.exchange import ExchangeBuffers, ExchangeContext, exchange_window
from mimo_pipes.observe.metrics import window_metrics
from mimo_pipes.observe.observer import ExchangeObserver, ExchangeRecord
from mimo_pipes.samples.sample import Sample, Window, held_bytes


class ExchangeStart(NamedTuple):
    """Where the loader over this node starts: the consumed micro-batches (-1: not known), which every exchange
    carries so that ranks of a module restored from different saves are refused; and the window whose
    micro-batches a saved run chose, as (first step, composition), or None."""

    consumed_microbatches: int = -1
    pinned: tuple[int, list[list[int]]] | None = None


class ExchangeReport:
    """Where a delivered window's :class:`~mimo_pipes.observe.observer.ExchangeRecord` goes: the observers, in
    window order, and the last metrics. The balance exchange makes it and shares it with its exchanging thread
    (read per window: the consumer may switch metric collection or add observers while windows are exchanged)
    and with the node that hands its windows on when that is another node (the window collator, to which each
    window carries its record). A plain object, not the node: no node calls the node it reads from, and a thread
    that holds it never keeps the node alive."""

    def __init__(self, observers: list[ExchangeObserver], collect_metrics: bool) -> None:
        self.observers = observers
        self.collect_metrics = collect_metrics
        self.last_metrics: dict[str, Any] | None = None

    def publish(self, record: ExchangeRecord | None) -> None:
        """The window ``record`` describes was handed on: its metrics are the last, its observers hear of it."""
        if record is None:
            return
        if record.metrics is not None:
            self.last_metrics = record.metrics
        for observer in self.observers:
            observer(record)


class WindowExchange:
    """One exchanging thread's step: the exchange of one window, with its own buffers, reused. With ``copy``
    received samples are unpacked as copies, so the windows made from them may wait to be collated (by
    :class:`~mimo_pipes.nodes.window_collator.WindowCollator`, after the exchange) while the next is received;
    without, they are views of the receive buffer, valid until the next exchange. ``check`` (if any) runs on
    this rank's samples before anything is sent, so a sample that cannot be collated fails on the rank that read
    it. Records what it did when the report collects metrics or has observers (the window's metrics are computed
    here, on the exchanging thread, off the training thread when overlapped)."""

    def __init__(self, ctx: ExchangeContext, check: Callable[[list[Sample]], None] | None, report: ExchangeReport,
                 start: ExchangeStart, copy: bool = True) -> None:
        self.ctx = ctx
        self.copy = copy
        self.start = start
        self.check = check
        self.report = report
        self.buffers = ExchangeBuffers()

    def __call__(self, window: Window, sequence: int, on_training_thread: bool) -> tuple[Window, ExchangeRecord | None]:
        collect = self.report.collect_metrics
        record = None
        if collect or self.report.observers:
            ctx = self.ctx
            record = ExchangeRecord(sequence, window.first_step, ctx.dp_rank, ctx.dp_size, ctx.grid_size,
                                    ctx.across_microbatches, on_training_thread=on_training_thread)
        consumed, pinned = self.start.consumed_microbatches, self.start.pinned
        composition = pinned[1] if pinned is not None and pinned[0] == window.first_step else None
        started = time.perf_counter()
        result = exchange_window(self.ctx, window, sequence, self.buffers, validate=self.check, record=record,
                                 consumed_microbatches=consumed, composition=composition, copy=self.copy)
        if record is not None:
            record.started_at = started
            record.exchange_seconds = time.perf_counter() - started
            record.window_bytes = held_bytes(result)
            if collect:
                record.metrics = window_metrics(record)
        return result, record
