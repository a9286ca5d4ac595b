"""SnapshotGuard: hands out deep copies of its source's state, so prefetching nodes keep true snapshots."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, valid_for

T = TypeVar("T")


class SnapshotGuard(BaseNode[T]):
    """Passes items through unchanged; its state is a deep copy of the source's state taken at call time.

    torchdata 0.11's Prefetcher and ParallelMapper store the source's ``state_dict()`` as their snapshot
    without copying it. A source that returns its live, mutable state dict then corrupts every snapshot
    as it reads ahead, and a restore skips items. Put this node directly under such a prefetching node.
    """

    SOURCE_KEY = "source"
    VALID_FOR_KEY = VALID_FOR_KEY

    def __init__(self, source: BaseNode[T]) -> None:
        super().__init__()
        self.source = source
        self.valid_for = valid_for(type(self).__name__, {})  # no settings: it only marks its place in the graph

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None:
            check_valid_for(initial_state, self.valid_for)
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else copy.deepcopy(initial_state[self.SOURCE_KEY]))

    def next(self) -> T:
        return next(self.source)

    def get_state(self) -> dict[str, Any]:
        return {self.VALID_FOR_KEY: copy.deepcopy(self.valid_for), self.SOURCE_KEY: copy.deepcopy(self.source.state_dict())}
