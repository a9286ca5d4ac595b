"""A module rank's graph served through ``torch.utils.data.DataLoader`` or torchdata's ``StatefulDataLoader``.

:class:`RankMicroBatches` is an ``IterableDataset`` view of the rank's :class:`~mimo_pipes.graph.loader.GraphLoader`:
its items are the rank's collated micro-batches. Serve it with ``batch_size=None`` and ``num_workers=0``:
the exchange's collectives must run in the process that joined the process group, so the loader's own
worker processes are refused; per-sample processing runs in worker processes of the graph itself (the
recipe's ``processing="process"``, ``--num-workers`` of them).

``StatefulDataLoader.state_dict()`` holds the graph's state (through the iterator, which is ``Stateful``),
and ``load_state_dict`` on a new loader over a new view resumes exactly, also inside a window. The stream
never restarts: iterating the loader again continues where it stopped (as every adapter's loader does);
``load_state_dict`` on the view takes effect at the next micro-batch, also through an iterator taken before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from mimo_pipes.graph.loader import GraphLoader


class RankMicroBatches(IterableDataset):
    """This rank's collated micro-batches; ``build()`` makes the rank's graph (e.g. ``lambda:
    vlm_sft.build(config, layout)``), once, on first use."""

    def __init__(self, build: Callable[[], GraphLoader]) -> None:
        super().__init__()
        self._build = build
        self._loader: GraphLoader | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def loader(self) -> GraphLoader:
        if self._loader is None:
            self._loader = self._build()
        if self._pending is not None:
            self._loader.load_state_dict(self._pending)
            self._pending = None
        return self._loader

    def __iter__(self) -> Iterator[dict]:
        if get_worker_info() is not None:
            raise RuntimeError(
                "RankMicroBatches runs the exchange's collectives: serve it with num_workers=0 (per-sample "
                "processing has its own workers in the graph)"
            )
        return _Stream(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self._pending if self._pending is not None else self.loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore at the next micro-batch, also through an iterator taken before (as GraphLoader does)."""
        if self._loader is None:
            self._pending = state_dict  # applied when the graph is built, before it starts
        else:
            self._loader.load_state_dict(state_dict)

    def close(self) -> None:
        """Stop the graph's threads and workers (the position is kept)."""
        if self._loader is not None:
            self._loader.close()


class _Stream(Iterator[dict]):
    """The iterator a DataLoader holds: stateful, so StatefulDataLoader saves and restores the graph."""

    def __init__(self, loader: GraphLoader) -> None:
        self.loader = loader

    def __next__(self) -> dict:
        return next(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loader.load_state_dict(state_dict)
