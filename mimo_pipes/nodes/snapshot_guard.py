"""SnapshotGuard: hands out deep copies of its source's state, so prefetching nodes keep true snapshots."""

from __future__ import annotations

from typing import TypeVar

from torchdata.nodes import BaseNode

from mimo_pipes.nodes.base import GraphNode

T = TypeVar("T")


class SnapshotGuard(GraphNode[T]):
    """Passes items through unchanged; its state is a deep copy of the source's state taken at call time.

    torchdata 0.11's Prefetcher and ParallelMapper store the source's ``state_dict()`` as their snapshot
    without copying it. A source that returns its live, mutable state dict then corrupts every snapshot
    as it reads ahead, and a restore skips items. Put this node directly under such a prefetching node.
    """

    def __init__(self, source: BaseNode[T]) -> None:
        super().__init__(source)
        self.describe({})  # no settings: it only marks its place in the graph

    def next(self) -> T:
        return next(self.source)
