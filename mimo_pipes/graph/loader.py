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
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from torchdata.nodes import BaseNode, Loader

from mimo_pipes.checkpoint.resume import ResumePoint, resume_point
from mimo_pipes.checkpoint.validity import (
    ON_ANOTHER_LAYOUT,
    VALID_FOR_KEY,
    check_graph_state,
    nested_node_states,
    on_other_layout,
)
from mimo_pipes.graph.torchdata_guards import close_at_exit, stop_torchdata_threads
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
from mimo_pipes.nodes.base import Restartable, StartChecked


class GraphLoader(Loader[dict]):
    """Iterates a graph's root node; ``state_dict`` / ``load_state_dict`` capture the whole graph.

    ``load_state_dict`` also takes a state saved by a rank of another layout of the same run (other DP sizes,
    canonical grid, TP, PP): when everything that shapes the global stream is unchanged, the graph starts at
    the saved global position instead of restoring node by node (see :meth:`load_state_dict`)."""

    ROOT_KEY = "root"
    NUM_YIELDED_KEY = "num_yielded"

    def __init__(self, root: BaseNode[dict], consumed_microbatches: int = 0) -> None:
        super().__init__(root, restart_on_stop_iteration=False)
        self.consumed_microbatches = consumed_microbatches  # micro-batches consumed before this graph was built
        # Where the graph starts (and a new pass after the stream ended): the last loaded (or closed-at) state,
        # or a start on another layout.
        self._pending_state: dict[str, Any] | None = None
        self._pending_start: tuple[ResumePoint, list[tuple[BaseNode, Any]]] | None = None
        self._started = False
        self._ended = False
        self._num_yielded = consumed_microbatches

    def __iter__(self) -> Iterator[dict]:
        """Start at the restored position (or ``consumed_microbatches``); once started, continue where the loader
        stands: ``it = iter(loader)`` then ``for batch in loader``, or a loop broken and run again, must neither
        repeat nor skip a micro-batch. A stream that ended starts a new pass."""
        if self._started and not self._ended:
            return self
        self._start()
        return self

    def _start(self) -> None:
        """Reset the graph to the restored position, or to ``consumed_microbatches`` when nothing was restored."""
        close_at_exit(self)  # one an exception kept from being closed stops its threads before the interpreter's teardown
        state, start = self._pending_state, self._pending_start
        nodes = graph_nodes(self.root)
        if start is not None:
            self._start_at(*start)
        position = self.consumed_microbatches if state is None else int(state[self.NUM_YIELDED_KEY])
        if state is not None:  # restored inside a window whose samples moved: keep its micro-batches
            composition = saved_composition(self.root, state[self.ROOT_KEY])
        else:  # a start on another layout keeps the saved window's micro-batches too
            composition = start[0].composition if start is not None else None
        first_step = resume_point(position, window_size(nodes)).first_step
        for node in nodes:
            if isinstance(node, StartChecked):  # every exchange then checks that the module's ranks agree
                node.expect_start(position, first_step, composition)
        self.root.reset(None if state is None else copy.deepcopy(state[self.ROOT_KEY]))
        self._num_yielded = position
        self._started, self._ended = True, False

    def __next__(self) -> dict:
        if not self._started:
            self._start()
        try:
            item = next(self.root)
        except StopIteration:
            self._ended = True
            raise
        self._num_yielded += 1
        return item

    @property
    def num_yielded(self) -> int:
        """Micro-batches handed out since the start of training (continues across restores)."""
        if not self._started and self._pending_state is not None:
            return int(self._pending_state[self.NUM_YIELDED_KEY])
        if not self._started and self._pending_start is not None:
            return self._pending_start[0].consumed
        return self._num_yielded

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore on the next ``iter`` or ``next`` (an iterator taken before keeps working, from the restored
        position on); raises StateMismatchError now if a node's settings differ.

        A state saved by a rank of another layout (another DP rank, DP size or canonical grid: TP and PP
        peers hold the same state) is taken when every other setting of every node is the same, the
        dataset included: the graph then starts at the saved global position (the consumed micro-batches;
        inside a window, at its start, skipping what was consumed, with the micro-batches the saved run
        gave it when samples moved between them), the exchange's windows-delivered count and its module's
        metric totals continue. Pass a state saved by a rank of the same module. Every source of the graph
        must be able to start at a given global micro-batch (``start_at``; the library's readers can)."""
        root_state = state_dict.get(self.ROOT_KEY) if isinstance(state_dict, dict) else None
        described = described_nodes(self.root)
        expected = [node.valid_for for node in described]
        if root_state is None or not on_other_layout(root_state, expected):
            check_graph_state(root_state, expected)
            self._pending_state, self._pending_start = copy.deepcopy(state_dict), None
            self._started = False
            return
        saved = nested_node_states(root_state)
        adjusted = [on_layout(node, state.get(VALID_FOR_KEY)) for node, state in zip(described, saved)]
        check_graph_state(root_state, adjusted + expected[len(adjusted):], ON_ANOTHER_LAYOUT)
        check_restartable(self.root)
        consumed = int(state_dict[self.NUM_YIELDED_KEY])
        point = resume_point(consumed, window_size(described), saved_composition(self.root, root_state))
        self._pending_state, self._pending_start = None, (point, [(node, copy.deepcopy(state)) for node, state in zip(described, saved)])
        self._started = False

    def _start_at(self, point: ResumePoint, saved: list[tuple[BaseNode, Any]]) -> None:
        """Move every node's fresh start to ``point`` (a state of another layout continues there)."""
        states = {id(node): state for node, state in saved}
        for node in graph_nodes(self.root):
            for target in (node, *wrapped(node)):
                if isinstance(target, Restartable):
                    target.start_at(point, states.get(id(node)))
        self.consumed_microbatches = point.consumed

    def state_dict(self) -> dict[str, Any]:
        if not self._started and self._pending_state is not None:
            return copy.deepcopy(self._pending_state)
        if not self._started:
            self._start()
        return copy.deepcopy({self.ROOT_KEY: self.root.state_dict(), self.NUM_YIELDED_KEY: self._num_yielded})

    def exchange_node(self) -> BalanceExchange | None:
        """The graph's BalanceExchange (None when the graph does not reorder)."""
        return next((node for node in graph_nodes(self.root) if isinstance(node, BalanceExchange)), None)

    def exchange_metrics(self) -> dict[str, Any] | None:
        """The exchange's metrics for the last window it delivered (see :mod:`mimo_pipes.observe.metrics`); None
        without an exchange (reordering off: every figure would equal its "before") or before the first window."""
        node = self.exchange_node()
        return node.metrics() if node is not None else None

    def close(self) -> None:
        """Stop every background thread of the graph (the exchange's prefetcher, torchdata's mapper
        workers); safe to call twice. The position is kept: iterating again resumes exactly there
        (windows that were prefetched are exchanged again)."""
        if self._started:
            self._pending_state, self._pending_start = self.state_dict(), None
            self._started = False
        # Consumers first: the exchange's prefetcher finishes the exchanges its peers may be in, reading
        # from its source, so the threads that feed it stop after it.
        for node in graph_nodes(self.root):
            close = getattr(node, "close", None)
            if callable(close):
                close()
            stop_torchdata_threads(node)
