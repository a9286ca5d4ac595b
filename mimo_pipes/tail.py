"""The graph's tail, added to any node of samples: costs -> windows -> exchange -> micro-batches (-> THD).

Every entry point builds its tail here from one :class:`~mimo_pipes.tail_settings.TailSettings`, so a
recipe, ``balance_iterator`` and the DataLoader adapter plan, exchange and collate alike.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import BalanceExchange, CostAnnotator, MicroBatchAssembler, SequencePacker, Windower
from mimo_pipes.sample import Sample
from mimo_pipes.tail_settings import TailSettings


def balanced_tail(samples: BaseNode[Sample], *, settings: TailSettings, layout: RankLayout) -> BaseNode[dict]:
    """This rank's micro-batches from ``samples`` (its B/d samples of every global micro-batch, in
    canonical order, from the first step of ``settings.resume`` on). Wrap the result in a GraphLoader
    with ``start_count=settings.resume.consumed``."""
    node: BaseNode[Any] = CostAnnotator(samples, settings=settings)
    node = Windower(node, settings=settings)
    if settings.plan.reorder:
        # Collates each window right after moving it (on the prefetch thread with overlap).
        node = BalanceExchange(node, settings=settings, layout=layout)
    node = MicroBatchAssembler(node, settings=settings)
    if settings.pack_sequences:
        # One THD row per micro-batch, after the exchange: packing never changes which samples a rank holds.
        node = SequencePacker(node, settings=settings)
    return node
