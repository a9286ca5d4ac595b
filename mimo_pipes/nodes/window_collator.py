"""WindowCollator: collates every window into its micro-batches, the one place of the graph that collates."""

from __future__ import annotations

import time

from torchdata.nodes import BaseNode

from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.read_ahead import on_hand_out
from mimo_pipes.nodes.window_exchange import ExchangeReport
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import Window


class WindowCollator(GraphNode[Window]):
    """Collates each window of its source with ``settings.collator`` (padding, concatenation:
    :mod:`mimo_pipes.samples.collate`); nothing else in the graph collates.

    It collates on the thread that asks for the window: the loader's read-ahead thread when the loader reads ahead
    (``read_ahead``, the library's one way of working ahead of the consumer), else the training thread. A window's
    record (``Window.record``, from the exchange) goes to ``report`` (the exchange's
    :class:`~mimo_pipes.nodes.window_exchange.ExchangeReport`) when the window's first micro-batch is handed to the
    consumer (:func:`~mimo_pipes.nodes.read_ahead.on_hand_out`), with the collation's time as its
    ``seconds["collate"]``, so observers and metrics follow the consumer, not the read-ahead.

    A window that cannot be collated raises here (a sample at fault is named with its field:
    :class:`~mimo_pipes.errors.SampleError`), reaching the consumer in its turn; the loader then tells the nodes
    before it, and the exchange announces it to the module's other ranks in place of its next exchange.

    The state is its source's. It has no setting of its own to be valid for: the collation it makes is what the
    assembler after it, and the exchange before it, are described with; a state saved before this node was
    part of the graph (its source's state, one level up) is read as its source's.
    """

    def __init__(self, source: BaseNode[Window], *, settings: TailSettings, report: ExchangeReport | None = None) -> None:
        super().__init__(source)
        self.collator: Collator = settings.collator
        self.report = report

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None and self.VALID_FOR_KEY in initial_state:
            initial_state = {self.SOURCE_KEY: initial_state}  # saved before this node existed: its source's state
        super().reset(initial_state)

    def next(self) -> Window:
        window = next(self.source)
        started = time.perf_counter()
        collated = self.collator.window(window)
        record = window.record
        if record is not None:
            record.seconds["collate"] = time.perf_counter() - started
        if self.report is not None:
            report = self.report
            on_hand_out(lambda: report.publish(record))
        return collated
