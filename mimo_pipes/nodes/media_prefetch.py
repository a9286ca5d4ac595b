"""MediaPrefetch: reads rows ahead of the one asked for and starts each one's media fetch as it is read."""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from torchdata.nodes import BaseNode

from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.nodes.read_ahead import fill_ahead

T = TypeVar("T")


class _Ahead(NamedTuple):
    item: Any
    state_after: Any  # the source's state right after it handed the item out


class MediaPrefetch(GraphNode[T]):
    """Passes its source's items through unchanged, reading ``ahead`` items beyond the one asked for and calling
    ``start(item)`` on each as it is read. ``start`` must return at once (it hands the item's fetches to a pool
    of its own, whose results the processing finds in a cache): images named by path in object storage are then
    fetched with their own bounded concurrency, ahead of need, whatever the processing threads number.

    The state is the source's state after the last item delivered; items read ahead are dropped on a restore
    and read again, so what is delivered does not depend on ``ahead``, which is why it is not in the state's
    description.
    """

    def __init__(self, source: BaseNode[T], *, start: Callable[[T], None], ahead: int) -> None:
        super().__init__(source)
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        self.start = start
        self.ahead = ahead
        self._pending: collections.deque[_Ahead] = collections.deque()
        self._source_ended = False
        self._state_after_delivered: Any = None
        self.describe({})

    def discard_ahead(self) -> None:
        self._pending.clear()

    def restore(self, initial_state: dict | None) -> None:
        self._state_after_delivered = copy.deepcopy(self.source.state_dict())
        self._source_ended = False

    def next(self) -> T:
        if not self._source_ended:
            self._source_ended = fill_ahead(self.source, self._pending, self.ahead, self._read) is not None
        if not self._pending:
            raise StopIteration
        ahead = self._pending.popleft()
        self._state_after_delivered = ahead.state_after
        return ahead.item

    def _read(self, item: T, state_after: Any) -> _Ahead:
        self.start(item)
        return _Ahead(item, state_after)

    def source_state(self) -> Any:
        return self._state_after_delivered
