"""The balance exchange for training loops that hold an iterator of collated micro-batches (Megatron style).

``balance_iterator`` composes existing nodes: the source (IterableWrapper) -> Uncollate -> the tail every
entry point shares (:func:`~mimo_pipes.graph.tail.balanced_tail`: CostAnnotator -> Windower -> BalanceExchange
-> WindowCollator -> MicroBatchAssembler (-> SequencePacker)), under an :class:`IteratorLoader`. Only the wiring
lives here.

Resuming: a plain iterator cannot be rewound, so the state only records counters (micro-batches taken
from the source up to the start of the current window, and how many of that window were handed out).
Restoring needs a source that can be positioned again: either ``source_factory(first_step)``,
which must return an iterator whose first micro-batch is global micro-batch ``first_step``, or an
iterable with its own ``state_dict`` / ``load_state_dict`` (a StatefulDataLoader, a GraphLoader), whose
state is saved and restored inside ours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torchdata.nodes import BaseNode, IterableWrapper, Stateful

from mimo_pipes.adapters.torchdata_pipeline import layout_tail
from mimo_pipes.checkpoint.resume import ResumePoint, resume_point
from mimo_pipes.config import DEFAULT_READ_AHEAD, ReorderConfig, flag
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.transport import check_read_ahead
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.graph.tail import balanced_tail
from mimo_pipes.nodes import Uncollate
from mimo_pipes.samples.mrope_layout import POSITION_IDS, to_mrope_first

SourceFactory = Callable[[int], Iterable[Mapping[str, Any]]]


class IteratorLoader(GraphLoader):
    """The loader ``balance_iterator`` returns: a :class:`GraphLoader` over an iterator of collated micro-batches,
    with ``state_dict`` / ``load_state_dict`` (plain data).

    ``iter`` never moves it (a later ``iter`` continues where it stands, as :class:`GraphLoader`'s);
    ``close()`` (or ``with``) stops the exchange's background thread. Over a plain iterator, closing ends it.
    A source that can be opened at a step (``window_aligned``) starts at the first step of the window holding
    the next micro-batch, as every graph does; a live iterator starts where it stands, its first window short.
    """

    def __init__(self, root, *, consumed_microbatches: int, restorable: bool, window_aligned: bool, mrope_first: bool = False,
                 read_ahead: int = 0) -> None:
        self.window_aligned = window_aligned  # read by _first_point, which the base's __init__ calls
        super().__init__(root, consumed_microbatches=consumed_microbatches, read_ahead=read_ahead)
        self.restorable = restorable
        self._spent = False  # closed over a plain iterator that had been read from
        self.mrope_first = mrope_first

    def _finisher(self) -> Callable[[dict], Any]:
        then = super()._finisher()
        if not self.mrope_first:
            return then
        return lambda batch: then(_mrope_back(batch))

    def _first_point(self, consumed_microbatches: int) -> ResumePoint:
        # A live iterator stands at the next micro-batch: nothing to skip. A restore starts at its window's start.
        return resume_point(consumed_microbatches, self._window_size, window_aligned=self.window_aligned)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.restorable:
            raise RuntimeError(
                "cannot restore: the source is a plain iterator, which cannot be rewound to the start of the "
                "saved window; pass source_factory=, or a source with state_dict/load_state_dict"
            )
        super().load_state_dict(state_dict)

    def _start(self) -> None:
        if self._spent:
            raise RuntimeError(
                "cannot iterate again after close(): the source is a plain iterator, which cannot be rewound to where "
                "this iterator stood (the exchange had read ahead of it); pass source_factory=, or a source with state_dict/load_state_dict"
            )
        super()._start()

    def close(self, *, drain: bool = True) -> None:
        spent = self._started and not self.restorable
        super().close(drain=drain)
        # A plain iterator cannot be rewound: closing ends the iteration (its state_dict still says where it stood).
        self._spent = self._spent or spent

    def __enter__(self) -> IteratorLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _mrope_back(batch: dict) -> dict:
    positions = batch.get(POSITION_IDS)
    if isinstance(positions, torch.Tensor) and positions.dim() == 3:
        batch[POSITION_IDS] = to_mrope_first(positions)  # back to the [3, rows, L] they came in
    return batch


class _CountedSource:
    """An iterable over ``open_at(first)`` whose state is the number of the next micro-batch it yields.

    A fresh start begins where the loader says (:meth:`start_at`, before every fresh start). IterableWrapper
    calls ``load_state_dict`` right before ``iter`` when it restores and only ``iter`` when it starts afresh,
    so a loaded position is used once.
    The state has one form for a factory and for a plain iterator, so either may restore the other's."""

    NEXT_KEY = "next_microbatch"

    def __init__(self, open_at: SourceFactory) -> None:
        self.open_at = open_at
        self.start = 0
        self.next_microbatch = 0
        self._resume_at: int | None = None

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        first = self.start if self._resume_at is None else self._resume_at
        self._resume_at = None
        self.next_microbatch = first
        return self._counted(iter(self.open_at(first)))

    def _counted(self, iterator: Iterator[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for batch in iterator:
            self.next_microbatch += 1
            yield batch

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next fresh start on, open the source at ``point.first_step`` (a state saved under
        another layout continues there)."""
        self.start, self._resume_at = point.first_step, None

    def state_dict(self) -> dict[str, int]:
        return {self.NEXT_KEY: self.next_microbatch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._resume_at = as_count(state[self.NEXT_KEY], self.NEXT_KEY)


def _open_once(microbatches: Iterable[Mapping[str, Any]], start: int) -> SourceFactory:
    """A plain iterator as a factory that can only open it where it stands."""
    def open_at(first: int) -> Iterable[Mapping[str, Any]]:
        if first != start:
            raise RuntimeError(f"a plain iterator cannot be rewound to micro-batch {first}; pass source_factory=")
        return microbatches
    return open_at


def balance_iterator(
    microbatches: Iterable[Mapping[str, Any]] | None = None,
    *,
    config: ReorderConfig,
    layout: RankLayout,
    micro_batch_size: int,
    image_token_id: int,
    pad_values: Mapping[str, int | float],
    seq_length: int | None,
    pad_to_seq_length: bool = True,
    merge_size: int = 2,
    consumed_microbatches: int = 0,
    source_factory: SourceFactory | None = None,
    pack_sequences: bool = False,
    pack_pad_multiple: int = 1,
    components: Sequence[str] | None = None,
    mrope_first: bool = False,
    read_ahead: int = DEFAULT_READ_AHEAD,
) -> IteratorLoader:
    """Balanced micro-batches from this rank's collated ones, in the same format plus metadata lists.

    ``microbatches`` (or ``source_factory``, exactly one) yields this rank's micro-batch of every global
    micro-batch from ``consumed_microbatches`` on: ``micro_batch_size // layout.dp_size`` rows in canonical
    order, right-padded ``[rows, L]`` token fields, ``pixel_values`` / ``image_grid_thw`` concatenated over
    the rows (see :class:`~mimo_pipes.nodes.uncollate.Uncollate` for how rows are split, and where
    ``sample_ids`` come from when the batch has none). ``micro_batch_size`` is the global B that all
    modules consume together. Output micro-batches are padded to ``seq_length`` with ``pad_values``
    (per field, default 0; ``labels`` -100), or to the longest row when ``pad_to_seq_length`` is false.

    With ``source_factory``, a start in the middle of a window reads from the window's start and skips
    ahead, exactly as a restored state does; an iterator that starts mid-window gets a short first
    window. With ``pack_sequences``, each output micro-batch is packed into one THD row (see
    :mod:`mimo_pipes.samples.thd`), every sequence padded to a multiple of ``pack_pad_multiple``. ``components``:
    every module's spec (as ``--component`` takes them), needed with a time model or two-level balance so
    that the planner's floor and encoder replicas are the run's. Raises ConfigError, naming the flag, on a
    bad setting. ``layout.module`` decides the fields the output carries and the exchange moves (a language
    rank: no pixels; see mimo_pipes/samples/module_fields.py).

    Position ids may have three rows (M-RoPE): ``[rows, 3, L]``, or with ``mrope_first`` ``[3, rows, L]``
    (Megatron's layout); each sample keeps its three rows, and they come out in the layout they came in
    (a packed micro-batch's as ``[1, 3, T]``, or ``[3, 1, T]`` with ``mrope_first``).

    ``read_ahead``: micro-batches made ahead of the consumer on the loader's thread (``PipelineConfig.read_ahead``;
    0: none); the loader's state is the state at the last micro-batch it handed out, whatever it read ahead.
    """
    if (microbatches is None) == (source_factory is None):
        raise TypeError("pass exactly one of microbatches and source_factory")
    consumed_microbatches = as_count(consumed_microbatches, "consumed_microbatches")
    merge_size = as_count(merge_size, "merge_size", minimum=1)
    if pad_to_seq_length and seq_length is None:
        raise ConfigError(flag("seq_length"), f"must be an integer >= 1 with {flag('pad_to_seq_length')} true, got None")
    tail = layout_tail(config, layout, micro_batch_size=micro_batch_size, image_token_id=image_token_id,
                       pad_length=seq_length if pad_to_seq_length else None, pad_values=pad_values, components=components,
                       pack_sequences=pack_sequences, pack_pad_multiple=pack_pad_multiple)
    read_ahead = check_read_ahead(read_ahead, exchange_on_gpu=layout.exchange_device is not None, exchanges=tail.plan.reorder,
                                  name="read_ahead")
    if source_factory is not None:
        source = IterableWrapper(_CountedSource(source_factory))
        restorable = True
    else:  # a live iterator starts where it stands: its first window may be short
        restorable = isinstance(microbatches, Stateful)
        # A stateful source's own state is saved and restored inside ours.
        counted = microbatches if restorable else _CountedSource(_open_once(microbatches, consumed_microbatches))
        source = IterableWrapper(counted)
    node: BaseNode[Any] = Uncollate(
        source,
        image_token_id=image_token_id,
        merge_size=merge_size,
        rows_per_batch=tail.samples_per_rank,
        dp_rank=layout.dp_rank,
        dp_size=layout.dp_size,
        mrope_first=mrope_first,
    )
    root = balanced_tail(node, settings=tail, layout=layout)
    return IteratorLoader(root, consumed_microbatches=consumed_microbatches, restorable=restorable,
                          window_aligned=source_factory is not None, mrope_first=mrope_first, read_ahead=read_ahead)
