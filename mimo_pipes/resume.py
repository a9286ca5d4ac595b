"""Resuming from a consumed micro-batch count alone (Megatron's arithmetic): where a graph restarts.

A graph restarts its reader at the first step of the window that holds the next micro-batch, because
a window is balanced as a whole, and its assembler skips the micro-batches of that window already
consumed. That yields exactly the stream of restoring the graph's full state.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_pipes.config import ReorderConfig


@dataclass(frozen=True)
class ResumePoint:
    """``consumed`` micro-batches are done; read from ``first_step`` and skip ``skip_first`` of them."""

    consumed: int
    first_step: int
    skip_first: int


def resume_point(consumed_microbatches: int, window_size: int) -> ResumePoint:
    """Windows start at multiples of W of the global step, on every rank and every module alike."""
    if consumed_microbatches < 0:
        raise ValueError(f"consumed micro-batches must be >= 0, got {consumed_microbatches}")
    if window_size < 1:
        raise ValueError(f"window size must be >= 1, got {window_size}")
    first_step = consumed_microbatches - consumed_microbatches % window_size
    return ResumePoint(consumed_microbatches, first_step, consumed_microbatches - first_step)


def reorder_window_size(reorder: ReorderConfig) -> int:
    """Micro-batches balanced together: ``--reorder-window-size`` when reordering, else 1."""
    return reorder.reorder_window_size if reorder.intra_microbatch_reorder else 1
