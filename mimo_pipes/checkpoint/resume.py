"""Where a graph starts: the consumed micro-batches, and what follows from them for the graph's nodes.

The loader (``GraphLoader``) alone takes the restart position, the consumed micro-batches, and derives one
:class:`ResumePoint` from it, which it tells every node (``GraphNode.start_at``). A window is balanced as a
whole, so a graph restarts its reader at the first step of the window that holds the next micro-batch, and its
assembler skips the micro-batches of that window already consumed: the same stream as restoring the graph's
full state. The same point, with the window's composition, restarts a graph of another layout from a saved
state. When the run's length is known (``GraphLoader.end_at``), the point also says where reading ends: at the
end of the window holding the run's last micro-batch, so nothing past the run is read, processed or exchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_pipes.config.counts import as_count


@dataclass(frozen=True)
class ResumePoint:
    """``consumed_microbatches`` are done; the graph's reader starts at global micro-batch ``first_step`` (the
    first step of a window: another concept, where a window starts) and the assembler skips ``skip_first`` of
    that window's micro-batches. ``composition``: which samples form each micro-batch of the window at
    ``first_step`` when they moved between its micro-batches (flat window indices per micro-batch; None:
    each micro-batch its own). ``end_step``: the step the reader stops before (a window boundary; None: it reads
    on until the data ends)."""

    consumed_microbatches: int
    first_step: int
    skip_first: int
    composition: list[list[int]] | None = None
    end_step: int | None = None


def resume_point(consumed_microbatches: int, window_size: int, composition: list[list[int]] | None = None, *,
                 window_aligned: bool = True) -> ResumePoint:
    """Windows start at multiples of W of the global step, on every rank and every module alike.
    ``window_aligned`` False: a source that starts where it stands (a live iterator): its first window is short."""
    consumed = as_count(consumed_microbatches, "consumed_microbatches")
    window_size = as_count(window_size, "window_size", minimum=1)
    first_step = consumed - consumed % window_size if window_aligned else consumed
    return ResumePoint(consumed, first_step, consumed - first_step, composition)


def end_step(end_microbatches: int | None, window_size: int, first_step: int) -> int | None:
    """Where a reader that starts at ``first_step`` stops for a run that ends once ``end_microbatches`` micro-batches
    are consumed: the end of the window holding the last of them (windows end at multiples of W of the global
    step), never before ``first_step``; None without an end."""
    if end_microbatches is None:
        return None
    end = as_count(end_microbatches, "end_microbatches")
    if end <= first_step:
        return first_step  # nothing left to read
    window_size = as_count(window_size, "window_size", minimum=1)
    return -(-end // window_size) * window_size
