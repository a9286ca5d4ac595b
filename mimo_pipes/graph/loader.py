"""GraphLoader: a torchdata Loader for a mimo-pipes graph, with torchdata 0.11's restore pitfalls fixed.

torchdata 0.11's Loader (a) counts one item twice after a restore (its look-ahead ``has_next`` bumps
``num_yielded``), (b) ignores ``load_state_dict`` when ``state_dict`` was called first (the iterator
made for that call is reused as is), and (c) hands out state dicts that may alias live node state.
This loader never looks ahead, applies a loaded state on the next ``iter`` (or ``next``), reports that pending
state from ``state_dict`` until then, and deep-copies every state it hands out or takes in. ``iter`` never moves
the loader: the first starts the graph (at the loaded state, or at ``consumed_microbatches``), every later one
continues where the loader stands, so no micro-batch is repeated or skipped (torchdata's Loader restarts on a
second ``iter``: a restored loader silently went back to step 0). Only a stream that ended starts a new pass,
from the same start. ``load_state_dict``
checks the state against every node of the graph at once (what each is valid for), so a state made for
other settings is refused right there, not at the next ``iter``; a state saved under another layout of the
same run continues the same global stream.

The loader alone takes where a run starts: the consumed micro-batches (``consumed_microbatches``, the one
name, in code and in the saved state; a state saved under the older key ``num_yielded`` loads as well). It
derives the :class:`~mimo_pipes.checkpoint.resume.ResumePoint` and tells every node before every reset
(``GraphNode.start_at``); no node takes or derives it otherwise. It alone also takes where a run ends, when the
consumer knows (``end_microbatches``, :meth:`GraphLoader.end_at`): the point then tells the reader to stop at the
end of the window holding the run's last micro-batch, so a short run reads, processes, plans and exchanges no
window it will not consume (the threads that read ahead would otherwise fill up to three more).

With ``read_ahead`` N > 0 the loader makes up to N whole micro-batches (collated, and through the function of
:meth:`GraphLoader.prepare_with`) ahead of the consumer on a thread of its own
(:class:`~mimo_pipes.nodes.read_ahead.ReadAhead`), each with the graph's state taken right after it there:
``state_dict`` is the state at the last micro-batch handed out, whatever was read ahead, so a restored loader
continues with the next one. An error made there is raised by ``next``, in its turn, with its own message.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torchdata.nodes import BaseNode, Loader

from mimo_pipes.checkpoint.resume import ResumePoint, end_step, resume_point
from mimo_pipes.checkpoint.validity import (
    ON_ANOTHER_LAYOUT,
    VALID_FOR_KEY,
    check_graph_state,
    nested_node_states,
    on_other_layout,
)
from mimo_pipes.config.counts import as_count
from mimo_pipes.errors import ConfigError, StateMismatchError
from mimo_pipes.graph.torchdata_guards import close_at_exit, forget_at_exit, stop_torchdata_threads
from mimo_pipes.graph.traversal import (
    check_restartable,
    described_nodes,
    graph_nodes,
    on_layout,
    saved_composition,
    window_size,
    wrapped,
)
from mimo_pipes.nodes.balance_exchange import BalanceExchange
from mimo_pipes.nodes.base import GraphNode, Restartable, kept_state
from mimo_pipes.nodes.read_ahead import ReadAhead
from mimo_pipes.samples.serial_torch import own_torch_setting_here

UNDRAINED_WAIT_S = 1.0
"""How long ``close(drain=False)`` waits for the read-ahead thread once the nodes under it were stopped."""


class GraphLoader(Loader[dict]):
    """Iterates a graph's root node; ``state_dict`` / ``load_state_dict`` capture the whole graph.

    ``consumed_microbatches``: where a fresh start begins (micro-batches consumed before this graph was built),
    and, as a property, the micro-batches handed out since the start of training (continues across restores).
    ``end_microbatches`` (or :meth:`end_at`): the consumed micro-batches at which the run stops; reading ends with
    the window that holds the last of them (the stream ends there; None, the default: it goes on).
    ``load_state_dict`` also takes a state saved by a rank of another layout of the same run (other DP sizes,
    canonical grid, TP, PP): when everything that shapes the global stream is unchanged, the graph starts at
    the saved consumed micro-batches instead of restoring node by node (see :meth:`load_state_dict`).
    ``read_ahead``: micro-batches made ahead of the consumer on a thread of the loader (0, the default here: none;
    the library's entry points pass ``PipelineConfig.read_ahead``)."""

    ROOT_KEY = "root"
    _reader: ReadAhead | None = None  # the read-ahead thread while started (a class default: __del__ after a failed __init__)
    CONSUMED_KEY = "consumed_microbatches"
    OLDER_CONSUMED_KEY = "num_yielded"  # what states saved before the one name held it under; still loaded

    def __init__(self, root: BaseNode[dict], consumed_microbatches: int = 0, end_microbatches: int | None = None,
                 read_ahead: int = 0) -> None:
        super().__init__(root, restart_on_stop_iteration=False)
        consumed_microbatches = as_count(consumed_microbatches, "consumed_microbatches")
        self.read_ahead = as_count(read_ahead, "read_ahead")
        self._reader: ReadAhead | None = None
        self._handed_state: Any = None  # with read-ahead: the root's state after the last micro-batch handed out
        self._prepare: Callable[[dict], Any] | None = None
        self._end: int | None = None
        self.end_at(end_microbatches)
        self._window_size = window_size(graph_nodes(root))
        # Where a fresh start begins (and a new pass after the stream ended), with each node's state saved under
        # another layout there (a start on another layout); else the last loaded (or closed-at) state.
        self._fresh_start = self._first_point(consumed_microbatches)
        self._fresh_states: dict[int, Any] = {}
        self._pending_state: dict[str, Any] | None = None
        self._started = False
        self._ended = False
        self._consumed = self._fresh_start.consumed_microbatches

    def end_at(self, end_microbatches: int | None) -> None:
        """The run stops once ``end_microbatches`` micro-batches are consumed (counted from the start of training,
        as ``consumed_microbatches``): from the next start on (``iter``, or ``next`` after a loaded state), the reader
        ends with the window holding the last of them. None: no end. Call it before iterating; a started loader
        keeps the end it started with until it starts again."""
        self._end = None if end_microbatches is None else as_count(end_microbatches, "end_microbatches")

    def prepare_with(self, prepare: Callable[[dict], Any] | None) -> None:
        """``next`` returns ``prepare(micro_batch)``, made where the micro-batch is made: on the read-ahead thread
        when the loader reads ahead (a stage's ``MimoModel`` keyword arguments, pinned host memory), so the
        training thread only takes it. Call it before iterating; None: the micro-batches themselves."""
        self._prepare = prepare

    def _finisher(self) -> Callable[[dict], Any]:
        """What every micro-batch goes through after the graph (a subclass's own step first), as a function that
        holds no reference to the loader (a loader dropped unclosed is still collected, and stops its thread)."""
        return (lambda batch: batch) if self._prepare is None else self._prepare

    def _point(self, consumed_microbatches: int, composition: list[list[int]] | None = None) -> ResumePoint:
        """Where the graph starts after ``consumed_microbatches``: its reader at the first step of the window
        holding the next one (see :func:`~mimo_pipes.checkpoint.resume.resume_point`)."""
        return resume_point(consumed_microbatches, self._window_size, composition)

    def _first_point(self, consumed_microbatches: int) -> ResumePoint:
        """Where the graph built after ``consumed_microbatches`` starts (a restored state says its own)."""
        return self._point(consumed_microbatches)

    def __iter__(self) -> Iterator[dict]:
        """Start at the restored consumed micro-batches (or ``consumed_microbatches``); once started, continue where the loader
        stands: ``it = iter(loader)`` then ``for batch in loader``, or a loop broken and run again, must neither
        repeat nor skip a micro-batch. A stream that ended starts a new pass."""
        if self._started and not self._ended:
            return self
        self._start()
        return self

    def _start(self) -> None:
        """Tell every node where the graph starts, then reset it to the restored state or the fresh start."""
        close_at_exit(self)  # one an exception kept from being closed stops its threads before the interpreter's teardown
        state = self._pending_state
        if state is None:
            point, saved = self._fresh_start, self._fresh_states
        else:  # restored inside a window whose samples moved: its micro-batches are kept
            point, saved = self._point(consumed_in(state), saved_composition(self.root, state[self.ROOT_KEY])), {}
        self._stop_reading_ahead()  # its thread reads the graph: stopped before the graph is reset
        own_torch_setting_here()  # before the reset starts torchdata's mappers, which set torch's setting for new threads
        point = dataclasses.replace(point, end_step=end_step(self._end, self._window_size, point.first_step))
        for node in graph_nodes(self.root):
            if isinstance(node, GraphNode):
                node.start_at(point, copy.deepcopy(saved.get(id(node))))
            elif state is None:  # a source of another library: only a fresh start is its to make
                for target in (node, *wrapped(node)):
                    if isinstance(target, Restartable):
                        target.start_at(point, None)
        self.root.reset(None if state is None else copy.deepcopy(state[self.ROOT_KEY]))
        self._consumed = point.consumed_microbatches
        self._started, self._ended = True, False
        if self.read_ahead:
            root, finish = self.root, self._finisher()
            self._handed_state = copy.deepcopy(root.state_dict())
            self._reader = ReadAhead(lambda: finish(next(root)), kept_state(root), self.read_ahead)

    def _stop_reading_ahead(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop(None)

    def __next__(self) -> Any:
        if not self._started:
            self._start()
        try:
            if self._reader is not None:
                item, self._handed_state = self._reader.take()
            else:
                item = self._finisher()(next(self.root))
        except StopIteration:
            self._ended = True
            raise
        except Exception as error:
            for node in graph_nodes(self.root):  # a node whose peers wait for it tells them (the exchange)
                if isinstance(node, GraphNode):
                    node.abort(error)
            raise
        self._consumed += 1
        return item

    @property
    def consumed_microbatches(self) -> int:
        """Micro-batches handed out since the start of training (continues across restores)."""
        if not self._started and self._pending_state is not None:
            return consumed_in(self._pending_state)
        if not self._started:
            return self._fresh_start.consumed_microbatches
        return self._consumed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore on the next ``iter`` or ``next`` (an iterator taken before keeps working, from the restored
        point on); raises StateMismatchError now if a node's settings differ.

        A state saved by a rank of another layout (another DP rank, DP size or canonical grid: TP and PP
        peers hold the same state) is taken when every other setting of every node is the same, the
        dataset included: the graph then starts at the saved consumed micro-batches (
        inside a window, at its start, skipping what was consumed, with the micro-batches the saved run
        gave it when samples moved between them), the exchange's windows-delivered count and its module's
        metric totals continue. Pass a state saved by a rank of the same module. Every source of the graph
        must be able to start at a given global micro-batch (``start_at``; the library's readers can)."""
        if state_dict is None:
            raise ValueError("load_state_dict(None): no state to restore (load_pipeline_state gives None where the checkpoint folder "
                             "holds no checkpoint to resume): start from the beginning without restoring, or build the loader with "
                             "consumed_microbatches=")
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"load_state_dict: a state is the dict state_dict() gave, got a {type(state_dict).__name__}")
        root_state = state_dict.get(self.ROOT_KEY)
        described = described_nodes(self.root)
        expected = [node.valid_for for node in described]
        if root_state is None or not on_other_layout(root_state, expected):
            check_graph_state(root_state, expected)
            self._pending_state = {self.ROOT_KEY: copy.deepcopy(root_state), self.CONSUMED_KEY: consumed_in(state_dict)}
            self._started = False
            return
        saved = nested_node_states(root_state)
        adjusted = [on_layout(node, state.get(VALID_FOR_KEY)) for node, state in zip(described, saved)]
        check_graph_state(root_state, adjusted + expected[len(adjusted):], ON_ANOTHER_LAYOUT)
        check_restartable(self.root)
        self._fresh_start = self._point(consumed_in(state_dict), saved_composition(self.root, root_state))
        self._fresh_states = {id(node): copy.deepcopy(state) for node, state in zip(described, saved)}
        self._pending_state, self._started = None, False

    def state_dict(self) -> dict[str, Any]:
        if not self._started and self._pending_state is not None:
            return copy.deepcopy(self._pending_state)
        if not self._started:
            self._start()
        root_state = self._handed_state if self._reader is not None else self.root.state_dict()
        return copy.deepcopy({self.ROOT_KEY: root_state, self.CONSUMED_KEY: self._consumed})

    def exchange_node(self) -> BalanceExchange | None:
        """The graph's BalanceExchange (None when the graph does not reorder)."""
        return next((node for node in graph_nodes(self.root) if isinstance(node, BalanceExchange)), None)

    def exchange_metrics(self) -> dict[str, Any] | None:
        """The exchange's metrics for the last window it delivered (see :mod:`mimo_pipes.observe.metrics`); None
        without an exchange (reordering off: every figure would equal its "before") or before the first window."""
        node = self.exchange_node()
        return node.metrics() if node is not None else None

    def close(self, *, drain: bool = True) -> None:
        """Stop every background thread of the graph (the read-ahead thread, the exchange's prefetcher, row
        processing's workers, torchdata's mapper workers); safe to call twice. The consumed micro-batches are kept:
        iterating again resumes exactly there (what was read ahead is made again). ``drain`` False: the read-ahead
        thread is not waited for, and ends with what it is making once the nodes under it stop, instead of first making
        all it may (for a job whose ranks stop on a signal and exit: what their peers' exchanges wait for ends with
        them)."""
        if self._started:
            self._pending_state = self.state_dict()
            self._started = False
        # Consumers first: the read-ahead thread makes all it may ahead, as every rank's does, then ends; the exchange's
        # prefetcher finishes the exchanges its peers may be in, reading from its source, so the threads that feed
        # it stop after it.
        reader, self._reader = self._reader, None
        if reader is not None:  # undrained: not waited for; stopping the nodes under it ends what it is making
            reader.stop(None if drain else 0, fill=drain)
        for node in graph_nodes(self.root):
            if isinstance(node, GraphNode):
                node.shutdown()
            stop_torchdata_threads(node)
        if reader is not None:
            reader.join(UNDRAINED_WAIT_S)
        forget_at_exit(self)

    def __del__(self) -> None:
        reader = self._reader
        if reader is not None:  # dropped unclosed (its thread holds the graph, not the loader): stopped as close stops it
            reader.stop(0)


def consumed_in(state_dict: Any) -> int:
    """The consumed micro-batches a loader's saved state holds (under the older key too); StateMismatchError
    naming the field when it holds none, or no count."""
    held = state_dict.get(GraphLoader.CONSUMED_KEY, state_dict.get(GraphLoader.OLDER_CONSUMED_KEY)) if isinstance(state_dict, dict) else None
    try:  # the one count check (numpy and torch integers are counts; bools, floats and strings are not)
        count = as_count(held, GraphLoader.CONSUMED_KEY, minimum=None)
    except ConfigError:
        raise StateMismatchError("GraphLoader", GraphLoader.CONSUMED_KEY, f"the saved state's {GraphLoader.CONSUMED_KEY} is "
                                 f"missing or not a count (got {held!r}): it is not a GraphLoader's state") from None
    if count < 0:
        raise StateMismatchError("GraphLoader", GraphLoader.CONSUMED_KEY, f"the saved state's {GraphLoader.CONSUMED_KEY} is "
                                 f"negative ({count})")
    return count
