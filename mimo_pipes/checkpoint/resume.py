"""Resuming from a consumed micro-batch count alone (Megatron's arithmetic): where a graph restarts.

A graph restarts its reader at the first step of the window that holds the next micro-batch, because
a window is balanced as a whole, and its assembler skips the micro-batches of that window already
consumed. That yields exactly the stream of restoring the graph's full state. The same point, with the
window's composition, restarts a graph of another layout from a saved state (``GraphLoader``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_pipes.config import ReorderConfig
from mimo_pipes.settings.counts import as_count


@dataclass(frozen=True)
class ResumePoint:
    """``consumed`` micro-batches are done; read from ``first_step`` and skip ``skip_first`` of them.
    ``composition``: which samples form each micro-batch of the window at ``first_step`` when they moved
    between its micro-batches (flat window indices per micro-batch; None: each micro-batch its own)."""

    consumed: int
    first_step: int
    skip_first: int
    composition: list[list[int]] | None = None


def resume_point(consumed_microbatches: int, window_size: int, composition: list[list[int]] | None = None) -> ResumePoint:
    """Windows start at multiples of W of the global step, on every rank and every module alike."""
    consumed_microbatches = as_count(consumed_microbatches, "consumed_microbatches")
    window_size = as_count(window_size, "window_size", minimum=1)
    first_step = consumed_microbatches - consumed_microbatches % window_size
    return ResumePoint(consumed_microbatches, first_step, consumed_microbatches - first_step, composition)


def reorder_window_size(reorder: ReorderConfig) -> int:
    """Micro-batches balanced together: ``--reorder-window-size`` when reordering, else 1."""
    return reorder.reorder_window_size if reorder.intra_microbatch_reorder else 1
