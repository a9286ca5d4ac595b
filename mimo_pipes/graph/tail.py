"""The graph's tail, added to any node of samples or counted rows: costs -> windows -> exchange -> (processing
->) collation -> micro-batches (-> THD).

Every entry point builds its tail here from one :class:`~mimo_pipes.config.tail_settings.TailSettings`, so a
recipe, ``balance_iterator`` and the DataLoader adapter plan, exchange and collate alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.config.flags import flag
from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import (
    BalanceExchange,
    CostAnnotator,
    MicroBatchAssembler,
    RowProcessor,
    SequencePacker,
    WindowCollator,
    Windower,
)
from mimo_pipes.nodes.row_processor import Masking
from mimo_pipes.samples.module_fields import module_fields
from mimo_pipes.samples.sample import Sample


def balanced_tail(
    items: BaseNode[Sample],
    *,
    settings: TailSettings,
    layout: RankLayout,
    process_rows: Callable[[Sample], Sample] | None = None,
    stand_in: Callable[[Sample], Sample] | None = None,
) -> BaseNode[dict]:
    """This rank's micro-batches from ``items`` (its B/d samples of every global micro-batch, in canonical
    order, from the first step the loader starts at on). Under the ``rows`` payload ``items`` are
    counted rows, which ``process_rows`` turns into this module's samples after the exchange; with
    ``settings.processing.mask_failed`` a row that fails there is masked on every module, ``stand_in``
    making what this module trains on in its place (:class:`~mimo_pipes.nodes.row_processor.Masking`, agreed
    on over ``layout.agreement_group``). Wrap the
    result in a GraphLoader, which alone takes where the run starts (``consumed_microbatches``). ``settings`` must be resolved for
    ``layout.module`` (``resolve_tail(..., module=layout.module)``): the module decides what moves."""
    if settings.fields != module_fields(layout.module):
        raise ValueError(
            f"the tail's settings carry the fields of role {settings.fields.role!r} but the layout's module "
            f"{layout.module!r} carries role {module_fields(layout.module).role!r}: resolve the tail with module=layout.module"
        )
    rows = settings.processing.rows
    if rows and process_rows is None:
        raise ConfigError(flag("exchange_payload"), "rows needs the function that processes a row after the exchange; "
                          f"this pipeline gives none (use {flag('exchange_payload')} samples)")
    if settings.processing.mask_failed and stand_in is None:
        raise ConfigError(flag("skip_bad_samples"), f"under {flag('exchange_payload')} rows needs what stands in for a row that fails "
                          f"after the exchange; this pipeline gives none (use {flag('exchange_payload')} samples)")
    node: BaseNode[Any] = CostAnnotator(items, settings=settings)
    node = Windower(node, settings=settings)
    exchange = None
    if settings.plan.reorder:
        # Only exchanges; each window carries its record to the collator, which reports it when it hands the window on.
        # Samples may stay views of its buffers where the collator collates each window in place, before the next.
        node = exchange = BalanceExchange(node, settings=settings, layout=layout, collatable=not rows, report_on_delivery=False,
                                          views_until_next=not rows, agree_after_end=rows)
    if rows:
        # Rows become this module's samples here, on the rank that trains on them.
        assert process_rows is not None
        masking = Masking(stand_in, layout.agreement_group) if stand_in is not None else None
        node = RowProcessor(node, settings=settings, process=process_rows, masking=masking)
    # The one place that collates, on the thread that asks: the loader's read-ahead thread when it reads ahead.
    node = WindowCollator(node, settings=settings, report=exchange.report if exchange is not None else None)
    node = MicroBatchAssembler(node, settings=settings)
    if settings.pack_sequences and settings.fields.packs:
        # One THD row per micro-batch, after the exchange: packing never changes which samples a rank holds.
        node = SequencePacker(node, settings=settings)
    return node
