"""Resuming from a consumed micro-batch count alone (Megatron's arithmetic): where a graph restarts.

A graph restarts its reader at the first step of the window that holds the next micro-batch, because
a window is balanced as a whole, and its assembler skips the micro-batches of that window already
consumed. That yields exactly the stream of restoring the graph's full state. The same point, with the
window's composition, restarts a graph of another layout from a saved state (``GraphLoader``).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    if consumed_microbatches < 0:
        raise ValueError(f"consumed micro-batches must be >= 0, got {consumed_microbatches}")
    if window_size < 1:
        raise ValueError(f"window size must be >= 1, got {window_size}")
    first_step = consumed_microbatches - consumed_microbatches % window_size
    return ResumePoint(consumed_microbatches, first_step, consumed_microbatches - first_step, composition)
