"""Windower: groups a rank's samples into micro-batches, and micro-batches into windows of W."""

from __future__ import annotations

from torchdata.nodes import BaseNode

from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.samples.sample import STEP, Sample, Window


class Windower(GraphNode[Window]):
    """Emits windows covering steps [k*W, (k+1)*W); a window is cut short only where the source ends.

    W and B/d come from ``settings``. Windows are aligned to multiples of W of the global step, so every
    rank and every module cuts the stream at the same places. The state is valid for one B/d and W.
    """

    def __init__(self, source: BaseNode[Sample], *, settings: TailSettings) -> None:
        super().__init__(source)
        samples_per_microbatch, window_size = settings.samples_per_rank, settings.plan.window_size
        if samples_per_microbatch < 1 or window_size < 1:
            raise ValueError("samples_per_microbatch and window_size must be >= 1")
        self.samples_per_microbatch = samples_per_microbatch
        self.window_size = window_size
        self.describe({"micro-batch size per rank": samples_per_microbatch, "window size": window_size})

    def _next_microbatch(self) -> list[Sample]:
        first = next(self.source)
        microbatch = [first]
        while len(microbatch) < self.samples_per_microbatch:
            try:
                sample = next(self.source)
            except StopIteration:
                raise RuntimeError(f"source ended inside micro-batch {first[STEP]}: it must yield whole micro-batches") from None
            if sample[STEP] != first[STEP]:
                raise RuntimeError(f"micro-batch {first[STEP]} got a sample of step {sample[STEP]}: source is out of order")
            microbatch.append(sample)
        return microbatch

    def next(self) -> Window:
        microbatches = [self._next_microbatch()]
        first_step = microbatches[0][0][STEP]
        while (first_step + len(microbatches)) % self.window_size:
            try:
                microbatches.append(self._next_microbatch())
            except StopIteration:
                break
        return Window(first_step=first_step, microbatches=microbatches)
