"""The contract every node of the graph keeps, written once.

A node is a ``torchdata.nodes.BaseNode``. Besides ``next`` / ``reset(initial_state)`` / ``get_state`` it:

* describes, once in ``__init__``, what its state is valid for (``valid_for``: its class and every setting
  that shapes its stream); ``get_state`` stores the description under ``VALID_FOR_KEY`` and
  ``reset(initial_state)`` refuses a state made for other settings before anything is read;
* keeps its source's state under ``SOURCE_KEY`` and resets its source with it (a reader has no source);
* may offer ``start_at(point, saved_state)`` (:class:`Restartable`): from the next fresh ``reset(None)`` on,
  start at a resume point (a consumed micro-batch count turned into a first step, see
  :mod:`mimo_pipes.checkpoint.resume`), which the loader calls on every node that has it to continue a state
  saved under another layout; the exchange also hears where the loader starts (:class:`StartChecked`).

Nodes ask nothing of each other: what a node must tell the node before it travels with the data (a window's
:class:`~mimo_pipes.samples.sample.WindowReceipt`).
"""

from __future__ import annotations

import copy
from typing import Any, Protocol, TypeVar, runtime_checkable

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, valid_for

T = TypeVar("T")


@runtime_checkable
class Restartable(Protocol):
    """A node that can start at a resume point on its next fresh reset (what the loader asks of it)."""

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None: ...


@runtime_checkable
class StartChecked(Protocol):
    """A node that checks where its module's ranks start (the balance exchange): the loader tells it, before
    every reset, the consumed micro-batches it starts at and the window whose micro-batches a saved run chose."""

    def expect_start(self, consumed_microbatches: int, first_step: int = 0, composition: list[list[int]] | None = None) -> None: ...


class GraphNode(BaseNode[T]):
    """A node with a described, checked state. Subclasses set ``valid_for`` through :meth:`describe` and put
    their own counters in :meth:`own_state` / :meth:`restore`; a node with a source passes it to ``__init__``."""

    SOURCE_KEY = "source"
    VALID_FOR_KEY = VALID_FOR_KEY

    def __init__(self, source: BaseNode | None = None) -> None:
        super().__init__()
        self.source = source
        self.valid_for: dict[str, Any] | None = None

    def describe(self, settings: dict[str, Any]) -> None:
        """What this node's state is valid for: its class name and ``settings`` (readable names, plain values)."""
        self.valid_for = valid_for(type(self).__name__, settings)

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None and self.valid_for is not None:
            check_valid_for(initial_state, self.valid_for)
        super().reset(initial_state)
        if self.source is not None:
            self.source.reset(None if initial_state is None else self.source_state_to_restore(initial_state))
        self.restore(initial_state)

    def source_state_to_restore(self, initial_state: dict) -> Any:
        """The state the source is reset with (a deep copy: a node never shares a state dict with its source)."""
        return copy.deepcopy(initial_state[self.SOURCE_KEY])

    def restore(self, initial_state: dict | None) -> None:
        """This node's own counters from ``initial_state`` (None: a fresh start). Nothing by default."""

    def own_state(self) -> dict[str, Any]:
        """This node's own counters, saved beside its source's state. None by default."""
        return {}

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.valid_for is not None:
            state[self.VALID_FOR_KEY] = copy.deepcopy(self.valid_for)
        if self.source is not None:
            state[self.SOURCE_KEY] = copy.deepcopy(self.source.state_dict())
        state.update(self.own_state())
        return state
