"""GraphLoader: a torchdata Loader for a mimo-pipes graph, with torchdata 0.11's restore pitfalls fixed.

torchdata 0.11's Loader (a) counts one item twice after a restore (its look-ahead ``has_next`` bumps
``num_yielded``), (b) ignores ``load_state_dict`` when ``state_dict`` was called first (the iterator
made for that call is reused as is), and (c) hands out state dicts that may alias live node state.
This loader never looks ahead, applies a loaded state on the next ``iter``, reports that pending state
from ``state_dict`` until then, and deep-copies every state it hands out or takes in. A loaded state stays
the loader's starting point: every later ``iter`` starts there again (torchdata's Loader restarts a
restored loader at step 0 on a second ``iter``, silently dropping the restored position). ``load_state_dict``
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
    on_saved_layout,
)
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.nodes.balance_exchange import BalanceExchange
from mimo_pipes.nodes.base import Restartable, StartChecked
from mimo_pipes.nodes.microbatch_assembler import MicroBatchAssembler
from mimo_pipes.nodes.windower import Windower


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
        # Where every fresh iter() starts: the last loaded (or closed-at) state, or a start on another layout.
        self._pending_state: dict[str, Any] | None = None
        self._pending_start: tuple[ResumePoint, list[tuple[BaseNode, Any]]] | None = None
        self._started = False
        self._num_yielded = consumed_microbatches

    def __iter__(self) -> Iterator[dict]:
        """Start (again) at the restored position, or at ``consumed_microbatches`` when nothing was restored."""
        state, start = self._pending_state, self._pending_start
        nodes = graph_nodes(self.root)
        if start is not None:
            self._start_at(*start)
        position = self.consumed_microbatches if state is None else int(state[self.NUM_YIELDED_KEY])
        if state is not None:  # restored inside a window whose samples moved: keep its micro-batches
            composition = _saved_composition(self.root, state[self.ROOT_KEY])
        else:  # a start on another layout keeps the saved window's micro-batches too
            composition = start[0].composition if start is not None else None
        first_step = resume_point(position, _window_size(nodes)).first_step
        for node in nodes:
            if isinstance(node, StartChecked):  # every exchange then checks that the module's ranks agree
                node.expect_start(position, first_step, composition)
        self.root.reset(None if state is None else copy.deepcopy(state[self.ROOT_KEY]))
        self._num_yielded = position
        self._started = True
        return self

    def __next__(self) -> dict:
        if not self._started:
            iter(self)
        item = next(self.root)
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
        """Restore on the next ``iter`` (and on every later one: the state stays the loader's starting
        point); raises StateMismatchError now if a node's settings differ.

        A state saved by a rank of another layout (another DP rank, DP size or canonical grid: TP and PP
        peers hold the same state) is taken when every other setting of every node is the same, the
        dataset included: the graph then starts at the saved global position (the consumed micro-batches;
        inside a window, at its start, skipping what was consumed, with the micro-batches the saved run
        gave it when samples moved between them), the exchange's windows-delivered count and its module's
        metric totals continue. Pass a state saved by a rank of the same module. Every source of the graph
        must be able to start at a given global micro-batch (``start_at``; the library's readers can)."""
        root_state = state_dict.get(self.ROOT_KEY) if isinstance(state_dict, dict) else None
        described = _described(self.root)
        expected = [node.valid_for for node in described]
        if root_state is None or not on_other_layout(root_state, expected):
            check_graph_state(root_state, expected)
            self._pending_state, self._pending_start = copy.deepcopy(state_dict), None
            self._started = False
            return
        saved = nested_node_states(root_state)
        adjusted = [_on_layout(node, state.get(VALID_FOR_KEY)) for node, state in zip(described, saved)]
        check_graph_state(root_state, adjusted + expected[len(adjusted):], ON_ANOTHER_LAYOUT)
        _check_restartable(self.root)
        consumed = int(state_dict[self.NUM_YIELDED_KEY])
        point = resume_point(consumed, _window_size(described), _saved_composition(self.root, root_state))
        self._pending_state, self._pending_start = None, (point, [(node, copy.deepcopy(state)) for node, state in zip(described, saved)])
        self._started = False

    def _start_at(self, point: ResumePoint, saved: list[tuple[BaseNode, Any]]) -> None:
        """Move every node's fresh start to ``point`` (a state of another layout continues there)."""
        states = {id(node): state for node, state in saved}
        for node in graph_nodes(self.root):
            for target in (node, *_wrapped(node)):
                if isinstance(target, Restartable):
                    target.start_at(point, states.get(id(node)))
        self.consumed_microbatches = point.consumed

    def state_dict(self) -> dict[str, Any]:
        if not self._started and self._pending_state is not None:
            return copy.deepcopy(self._pending_state)
        if not self._started:
            iter(self)
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
            _stop_torchdata_threads(node)


def _stop_torchdata_threads(node: BaseNode) -> None:
    # torchdata 0.11's ParallelMapper (in the inner node it holds as ``_it``), Prefetcher and PinMemory run
    # their threads in an iterator kept as ``_it`` that stops them only in ``_shutdown()``, called when it
    # is garbage collected or the node is reset; stop them now. The next reset() builds a new iterator.
    iterator = getattr(node, "_it", None)
    shutdown = getattr(iterator, "_shutdown", None)
    if callable(shutdown):
        _stop_readers_first(iterator)
        shutdown()
        _wait_for_worker_processes(iterator)
        node._it = None


def _stop_readers_first(iterator: object) -> None:
    """With worker processes, torchdata's ``_shutdown`` stops the workers while its sort thread may still be
    receiving a worker's result: tensors travel as file descriptors a worker shares until it exits, so a
    thread that outlives the workers fails in the resource sharer (FileNotFoundError). Stop the threads
    that read (the source reader, the sort thread) and wait for them while the workers still run."""
    stop, process_stop = getattr(iterator, "_stop", None), getattr(iterator, "_mp_stop", None)
    if getattr(iterator, "method", None) != "process" or stop is None or process_stop is None:
        return
    stop.set()
    for name in ("_read_thread", "_sort_thread"):
        thread = getattr(iterator, name, None)
        if thread is not None and thread.is_alive():
            thread.join()


def _wait_for_worker_processes(iterator: object, timeout_s: float = 60.0) -> None:
    """torchdata waits a tenth of a second for each worker process; one still starting (importing torch
    takes seconds) then finds the stop event's semaphore gone with its iterator and fails with a traceback.
    Wait until every worker has seen the stop and ended, while the iterator still holds the event."""
    if getattr(iterator, "method", None) != "process":
        return
    for worker in getattr(iterator, "_workers", []):
        join = getattr(worker, "join", None)
        if callable(join):
            join(timeout_s)


def _described(root: BaseNode) -> list[BaseNode]:
    return [node for node in graph_nodes(root) if isinstance(getattr(node, "valid_for", None), dict)]


def _on_layout(node: BaseNode, saved: Any) -> dict[str, Any]:
    """``node``'s description on the layout ``saved`` (a saved description) records."""
    if not isinstance(saved, dict) or saved.get("node") != node.valid_for.get("node"):
        return node.valid_for  # another graph: the plain check names it
    own = getattr(node, "valid_for_layout", None)
    return own(saved) if callable(own) else on_saved_layout(node.valid_for, saved)


def _window_size(nodes: list[BaseNode]) -> int:
    return next((node.window_size for node in nodes if isinstance(node, Windower)), 1)


def _saved_composition(root: BaseNode, root_state: Any) -> list[list[int]] | None:
    """The composition a saved state holds for the window it stands in (MicroBatchAssembler keeps it)."""
    for node, state in zip(_described(root), nested_node_states(root_state)):
        if isinstance(node, MicroBatchAssembler):
            return copy.deepcopy(state.get(MicroBatchAssembler.COMPOSITION_KEY))
    return None


def _wrapped(node: BaseNode) -> list[Any]:
    """What a torchdata wrapper reads from (IterableWrapper's iterable, SamplerWrapper's sampler)."""
    return [value for value in (getattr(node, "iterable", None), getattr(node, "sampler", None)) if value is not None]


def _check_restartable(root: BaseNode) -> None:
    """Every source of the graph can start at a given global micro-batch (``start_at``), or StateMismatchError."""
    for node in graph_nodes(root):
        if _linked_nodes(node):
            continue
        if not any(isinstance(target, Restartable) for target in (node, *_wrapped(node))):
            name = type(next(iter(_wrapped(node)), node)).__name__
            raise StateMismatchError(
                name, "dp size",
                f"the state was saved under another layout, and this graph's source {name} cannot start at a given "
                "global micro-batch (it has no start_at): restore a state saved under this layout, or resume from the "
                "consumed micro-batch count",
            )


def graph_nodes(root: BaseNode) -> list[BaseNode]:
    """Every node reachable from ``root``, each once, consumers before their sources.

    A node's links are its attributes that hold a node, or a list, tuple, set or dict of nodes
    (``source``, several sources, torchdata's inner nodes)."""
    order: list[BaseNode] = []
    seen = {id(root)}
    stack = [(root, iter(_linked_nodes(root)))]
    while stack:  # depth first; the reversed post-order puts every node before the nodes it reads
        node, links = stack[-1]
        child = next(links, None)
        if child is None:
            stack.pop()
            order.append(node)
        elif id(child) not in seen:
            seen.add(id(child))
            stack.append((child, iter(_linked_nodes(child))))
    order.reverse()
    return order


def _linked_nodes(node: BaseNode) -> list[BaseNode]:
    linked = []
    for value in getattr(node, "__dict__", {}).values():
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple, set, frozenset)):
            linked.extend(item for item in value if isinstance(item, BaseNode))
        elif isinstance(value, BaseNode):
            linked.append(value)
    return linked
