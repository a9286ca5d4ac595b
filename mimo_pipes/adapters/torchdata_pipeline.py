"""The balance exchange behind a torchdata.nodes pipeline you already have: your reader and mappers, then the tail.

your reader -> your mappers (Mapper / ParallelMapper) -> CostAnnotator -> Windower -> BalanceExchange
-> WindowCollator -> MicroBatchAssembler -> GraphLoader.

Your part must yield this rank's B/d samples of every global micro-batch, in canonical order (DP rank r
of d holds positions r*B/d .. (r+1)*B/d - 1), each a dict of unpadded tensors with ``sample_id`` and
``step`` (see mimo_pipes/samples/sample.py), starting where the loader says: a source with ``start_at`` (a
torchdata node, or the sampler or iterable under torchdata's wrappers) is told; any other must start at
:func:`reader_first_step` itself. :func:`balanced_loader`
appends the library's part with :func:`~mimo_pipes.graph.tail.balanced_tail`. ``recipes/existing_pipeline.py``
shows one way to write the reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.resume import resume_point
from mimo_pipes.config import DEFAULT_READ_AHEAD, ReorderConfig, reorder_window_size
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.tail_settings import TailSettings, resolve_tail
from mimo_pipes.config.transport import check_read_ahead
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.graph.tail import balanced_tail
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.samples.sample import Sample


def reader_first_step(reorder: ReorderConfig, consumed_microbatches: int = 0) -> int:
    """The global micro-batch a reader that cannot be told (no ``start_at``) must start at to resume after
    ``consumed_microbatches``: what the loader tells a reader that can (the same function)."""
    return resume_point(as_count(consumed_microbatches, "consumed_microbatches"), reorder_window_size(reorder)).first_step


def balanced_loader(
    samples: BaseNode[Sample],
    *,
    reorder: ReorderConfig,
    layout: RankLayout,
    micro_batch_size: int,
    seq_length: int,
    image_token_id: int | tuple[int, ...],
    pad_values: Mapping[str, int | float],
    pad_to_seq_length: bool = True,
    consumed_microbatches: int = 0,
    components: Sequence[str] | None = None,
    read_ahead: int = DEFAULT_READ_AHEAD,
) -> GraphLoader:
    """This rank's loader of balanced, padded micro-batches over your ``samples`` node.

    ``samples`` starts at global micro-batch ``reader_first_step(reorder, consumed_microbatches)`` (the loader
    tells a source with ``start_at`` so); the loader skips what was already consumed of that window. ``micro_batch_size`` is the global B. ``components``:
    every module's spec (as ``--component`` takes them), needed with a time model or two-level balance so
    that the planner's floor and encoder replicas are the run's. ``layout.module`` decides the fields this
    rank's micro-batches carry and the exchange moves (a language rank: no pixels; see
    mimo_pipes/samples/module_fields.py). Bad settings raise ConfigError naming the flag. The loader's
    ``state_dict`` holds your nodes' state too, so restoring it restores your reader. ``read_ahead``: micro-batches
    made ahead of the consumer on the loader's thread (``PipelineConfig.read_ahead``; 0: none); the state is the
    state at the last micro-batch handed out, whatever was read ahead.
    """
    tail = layout_tail(reorder, layout, micro_batch_size=micro_batch_size, image_token_id=image_token_id,
                       pad_length=seq_length if pad_to_seq_length else None, pad_values=pad_values,
                       components=components)
    read_ahead = check_read_ahead(read_ahead, exchange_on_gpu=layout.exchange_device is not None, exchanges=tail.plan.reorder,
                                  name="read_ahead")
    return GraphLoader(balanced_tail(samples, settings=tail, layout=layout), consumed_microbatches=consumed_microbatches,
                       read_ahead=read_ahead)


def layout_tail(
    reorder: ReorderConfig,
    layout: RankLayout,
    *,
    micro_batch_size: int,
    image_token_id: int | tuple[int, ...],
    pad_length: int | None,
    pad_values: Mapping[str, int | float],
    components: Sequence[str] | None,
    **options: object,
) -> TailSettings:
    """The tail's settings of an adapter on this rank's ``layout`` (its DP place and its module), as every
    adapter resolves them; ``options`` go to :func:`~mimo_pipes.config.tail_settings.resolve_tail` as they are."""
    return resolve_tail(
        reorder,
        micro_batch_size=micro_batch_size,
        dp_size=layout.dp_size,
        grid_size=layout.grid_size,
        image_token_ids=image_token_id,
        pad_length=pad_length,
        pad_values=pad_values,
        topology=build_topology(components) if components is not None else None,
        module=layout.module,
        **options,
    )
