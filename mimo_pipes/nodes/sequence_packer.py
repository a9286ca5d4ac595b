"""SequencePacker: packs each collated micro-batch into one THD row (sequence packing, no padding rows)."""

from __future__ import annotations

from torchdata.nodes import BaseNode

from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.read_ahead import on_hand_out
from mimo_pipes.samples.thd import check_pad_multiple, pack_microbatch, packing_metrics


class SequencePacker(GraphNode[dict]):
    """Yields the THD form of each micro-batch of its source (:func:`mimo_pipes.samples.thd.pack_microbatch`).

    Every sequence is padded to a multiple of ``settings.pack_pad_multiple`` with the collator's pad values.
    Stateless per micro-batch, so its state is its source's. ``last_metrics`` holds the counts of the
    micro-batch handed to the consumer last (padding fraction before and after packing, tokens per packed row):
    set when the loader hands it out, not when it is made ahead.
    """

    def __init__(self, source: BaseNode[dict], *, settings: TailSettings) -> None:
        super().__init__(source)
        check_pad_multiple(settings.pack_pad_multiple)
        self.pad_multiple = settings.pack_pad_multiple
        self.pad_values = dict(settings.collator.pad_values)
        self.last_metrics: dict[str, float | int] | None = None

    def restore(self, initial_state: dict | None) -> None:
        self.last_metrics = None

    def next(self) -> dict:
        batch = next(self.source)
        packed = pack_microbatch(batch, pad_multiple=self.pad_multiple, pad_values=self.pad_values)
        metrics = packing_metrics(batch, packed).as_dict()
        on_hand_out(lambda: setattr(self, "last_metrics", metrics))  # follows the consumer, not the read-ahead
        return packed
