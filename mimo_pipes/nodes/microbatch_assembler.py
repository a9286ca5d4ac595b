"""MicroBatchAssembler: splits collated windows into micro-batches, one per step."""

from __future__ import annotations

import copy
from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.resume import ResumePoint
from mimo_pipes.checkpoint.validity import collation_settings
from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.samples.sample import Window


class MicroBatchAssembler(GraphNode[dict]):
    """Yields one micro-batch per step of each collated window (collated before it, by
    :class:`~mimo_pipes.nodes.window_collator.WindowCollator`; an uncollated window is refused).

    Its state is the source's state from before the current window plus how many of the window's
    micro-batches were yielded, so a restore inside a window re-reads that window and skips ahead. A fresh
    start in the middle of a window (resume from a count) does the same: the loader tells it how many of the
    first window's micro-batches were consumed (:meth:`start_at`); a state taken before the first window is
    read carries that pending skip. Inside a window
    whose samples moved between micro-batches, the state also keeps the window's composition (which
    samples each micro-batch holds, as flat window indices: W x B integers at most), so the window is
    re-exchanged with exactly those micro-batches, on this layout or another (see :meth:`start_at`).
    The state is valid for the collation of the windows it splits (pad length and values).
    """

    YIELDED_KEY = "yielded_in_window"
    COMPOSITION_KEY = "window_composition"

    def __init__(self, source: BaseNode[Window], *, settings: TailSettings) -> None:
        super().__init__(source)
        self.skip_first = 0  # micro-batches of the first window already consumed: the loader says (start_at)
        self.start_composition: list[list[int]] | None = None  # the first window's, when started inside it (start_at)
        self.describe(collation_settings(settings.collator))

    def start_at(self, point: ResumePoint, saved_state: Any = None) -> None:
        """From the next ``reset(None)`` on, start inside the window at ``point.first_step``: skip its first
        ``point.skip_first`` micro-batches, keeping ``point.composition`` for a state taken before it is read."""
        self.skip_first = point.skip_first
        self.start_composition = point.composition

    def restore(self, initial_state: dict | None) -> None:
        self._window: Window | None = None
        if initial_state is None:
            self._window_start_state: dict[str, Any] | None = None
            self._yielded = self.skip_first
            self._pending_composition = self.start_composition if self.skip_first else None
        else:
            # The source was reset to the start of the window the state was taken in: it is re-read.
            self._window_start_state = copy.deepcopy(initial_state[self.SOURCE_KEY])
            self._yielded = int(initial_state[self.YIELDED_KEY])
            self._pending_composition = copy.deepcopy(initial_state.get(self.COMPOSITION_KEY))

    def next(self) -> dict:
        while self._window is None or self._yielded >= len(self._window.microbatches):
            if self._window is not None:
                self._yielded -= len(self._window.microbatches)
            self._window_start_state = copy.deepcopy(self.source.state_dict())
            self._window = next(self.source)
            if not self._window.collated:
                raise TypeError(f"MicroBatchAssembler: the window at step {self._window.first_step} is not collated: "
                                "a WindowCollator goes before the assembler (graph/tail.py builds it so)")
        microbatch = self._window.microbatches[self._yielded]
        self._yielded += 1
        return microbatch

    def _saved(self) -> tuple[Any, int, list[list[int]] | None]:
        """The source's state to save, the micro-batches of its window yielded, and that window's composition."""
        window_done = self._window is not None and self._yielded == len(self._window.microbatches)
        if window_done:
            # At a window boundary the source's current state starts the next window: no re-read on restore.
            return self.source.state_dict(), 0, None
        if self._window_start_state is None:
            # No window read yet: the source stands at the first one, of which ``skip_first`` are still to skip.
            return self.source.state_dict(), self._yielded, self._pending_composition
        composition = self._window.composition if self._window is not None else self._pending_composition
        return self._window_start_state, self._yielded, composition

    def source_state(self) -> Any:
        # The source's state from before the current window, not its live one (see the class docstring).
        return self._saved()[0]

    def own_state(self) -> dict[str, Any]:
        _, yielded, composition = self._saved()
        state: dict[str, Any] = {self.YIELDED_KEY: yielded}
        if composition is not None and yielded:
            state[self.COMPOSITION_KEY] = composition
        return state
