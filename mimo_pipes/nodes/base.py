"""The contract every node of the graph keeps, written once: :class:`GraphNode`.

Every node of the library is a ``GraphNode``, a ``torchdata.nodes.BaseNode`` that keeps ``next`` /
``reset(initial_state)`` / ``get_state`` and whose state the base class wraps from what the node declares:

* ``describe(settings)``, once in ``__init__``: what its state is valid for (its class and every setting
  that shapes its stream). ``get_state`` stores it under ``VALID_FOR_KEY``; ``reset(initial_state)``
  refuses a state made for other settings before anything is read. :meth:`GraphNode.valid_for_layout`
  says how the description reads on another layout.
* its source (``sources()``: the nodes it reads, named explicitly), whose state it keeps under ``SOURCE_KEY``:
  the source's state after the last item this node delivered (:meth:`GraphNode.source_state`; a node that
  reads ahead or stands inside an item it re-reads says which), and resets its source with it.
* its own fields (:meth:`GraphNode.own_state` / :meth:`GraphNode.restore`).
* where a run starts (:meth:`GraphNode.start_at`): the loader, which alone takes the consumed micro-batches,
  tells every node before every reset.
* :meth:`GraphNode.shutdown` (stop its threads and workers) and :meth:`GraphNode.abort` (the graph stopped on a
  failure after this node: a node whose peers wait for it tells them), both called by the loader.

Data flows one way: no node calls the node it reads from. What a node must tell the nodes after it travels
with the data (a window's :class:`~mimo_pipes.observe.observer.ExchangeRecord`); a failure after a node
reaches it through the loader (:meth:`GraphNode.abort`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, on_saved_layout, plain_copy, valid_for

T = TypeVar("T")


@runtime_checkable
class Restartable(Protocol):
    """What a source that is not a node may offer (a user's sampler or iterable under torchdata's wrappers):
    start at a resume point on its next fresh start. The loader tells it before a fresh start."""

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None: ...


class GraphNode(BaseNode[T]):
    """A node with a described, checked state, an explicit source, a start and a shutdown.

    Subclasses call ``super().__init__(source)``, set ``valid_for`` through :meth:`describe`, and declare their
    own fields (:meth:`own_state` / :meth:`restore`); a node whose saved source state is not the live one
    overrides :meth:`source_state`, a node that holds items read ahead drops them in :meth:`discard_ahead`."""

    SOURCE_KEY = "source"
    VALID_FOR_KEY = VALID_FOR_KEY

    def __init__(self, source: BaseNode | None = None) -> None:
        super().__init__()
        self.source = source
        self.valid_for: dict[str, Any] | None = None

    def describe(self, settings: dict[str, Any]) -> None:
        """What this node's state is valid for: its class name and ``settings`` (readable names, plain values)."""
        self.valid_for = valid_for(type(self).__name__, settings)

    def sources(self) -> tuple[BaseNode, ...]:
        """The nodes this node reads from (none for a reader)."""
        return () if self.source is None else (self.source,)

    def valid_for_layout(self, saved: dict[str, Any]) -> dict[str, Any]:
        """This node's description on the layout a saved description records (another DP rank and size)."""
        assert self.valid_for is not None, "only a described node is checked against a saved state"
        return on_saved_layout(self.valid_for, saved)

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """Where the graph starts at the next reset, told by the loader before every reset: ``point`` (the
        consumed micro-batches and what follows from them). ``saved_state``: this node's state saved under
        another layout at ``point`` (None otherwise). A reset with a state restores it instead. Nothing by
        default: a node without a position of its own."""

    def abort(self, error: BaseException) -> None:
        """The graph stopped on ``error``, raised after this node (told by the loader). Nothing by default."""

    def shutdown(self) -> None:
        """Stop this node's threads and workers (iterating again restarts them). Nothing by default."""

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None and self.valid_for is not None:
            check_valid_for(initial_state, self.valid_for)
        super().reset(initial_state)
        self.discard_ahead()
        if self.source is not None:
            self.source.reset(None if initial_state is None else copy.deepcopy(initial_state[self.SOURCE_KEY]))
        self.restore(initial_state)

    def discard_ahead(self) -> None:
        """Drop what was read ahead of the consumer, before the source is reset. Nothing by default."""

    def restore(self, initial_state: dict | None) -> None:
        """This node's own fields from ``initial_state`` (None: a fresh start). Nothing by default."""

    def own_state(self) -> dict[str, Any]:
        """This node's own fields, saved beside its source's state. None by default."""
        return {}

    def source_state(self) -> Any:
        """The source's state to save: after the last item this node delivered. By default the live one (a
        node that reads one item per item it delivers)."""
        assert self.source is not None
        return self.source.state_dict()

    def get_state(self) -> dict[str, Any]:
        # Called once per item under torchdata's prefetching nodes (their snapshots), on threads that share the
        # GIL with the processing: copies are made only where something could change the saved values later.
        state: dict[str, Any] = {}
        if self.valid_for is not None:
            state[self.VALID_FOR_KEY] = plain_copy(self.valid_for)
        if self.source is not None:
            if type(self).source_state is GraphNode.source_state and isinstance(self.source, GraphNode):
                state[self.SOURCE_KEY] = self.source.state_dict()  # the live state, built afresh by that call
            else:  # a kept snapshot, or a node not of this library (torchdata's keep theirs): copied
                state[self.SOURCE_KEY] = copy.deepcopy(self.source_state())
        state.update(copy.deepcopy(self.own_state()))
        return state


def kept_state(node: BaseNode[Any]) -> Callable[[], Any]:
    """What gives ``node``'s state as a value that nothing changes later, for a reader that keeps it beside an item
    it made ahead (:class:`~mimo_pipes.nodes.read_ahead.ReadAhead`): a :class:`GraphNode` builds its state afresh
    on every call (:meth:`GraphNode.get_state` copies what could change), so it is taken as it is; another node's
    may share what the node goes on changing, so it is deep-copied. One copy a state, not two: the read-ahead
    takes a state for every item, on a thread that shares the interpreter lock with the training thread."""
    if isinstance(node, GraphNode):
        return node.state_dict
    return lambda: copy.deepcopy(node.state_dict())
