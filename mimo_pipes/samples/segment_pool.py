"""Shared-memory segments used again once their micro-batch is gone: :class:`SegmentPool`.

With worker processes (``processing="process"``) a micro-batch's pixels are written by the workers into one
shared-memory segment (:class:`~mimo_pipes.samples.handover.Destination`). Made fresh for every micro-batch, the
segment's pages are allocated and zeroed by the kernel as the workers first touch them, and given back when the
micro-batch is dropped, on the training thread (tens of milliseconds a micro-batch: 100-200 MB of pixels at 14
workers on light rows). A pooled segment stays allocated and named: the next micro-batch's rows are written into
pages that already exist, and dropping a micro-batch only puts its segment back on a list. It is the worker
processes' counterpart of :class:`~mimo_pipes.samples.buffer_pool.BufferPool`.

A pooled segment keeps its name while the pool holds it, so that the workers can open it. Every name goes when the
pool lets its segment go (beyond the few spare ones), when the pool is cleared (its workers stopped: a segment
still lent keeps its memory, not its name, and is not pooled again), and, at the latest, when this process exits
(:func:`~mimo_pipes.samples.handover.sweep`).
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import threading
import weakref
from typing import NamedTuple

import numpy as np

from mimo_pipes.samples.buffer_pool import ROUND_BYTES, SPARE_BUFFERS, take_fitting
from mimo_pipes.samples.handover import FOLDER, SEGMENT_PREFIX, sized_segment

_made = itertools.count()


class Segment(NamedTuple):
    """One named shared-memory segment of ``size`` bytes, mapped in this process."""

    name: str
    size: int
    mapped: mmap.mmap


class SegmentPool:
    """Shared-memory segments lent for one micro-batch each and taken back when every view of them is gone
    (:meth:`take`). Safe to take from one thread while views are dropped on others. :meth:`clear` lets the
    spare segments go (a segment still lent goes when its views do)."""

    def __init__(self, owner: int, spare: int = SPARE_BUFFERS) -> None:
        self.owner = owner  # the process the segments are for: the one that collates their micro-batches
        self.spare = spare
        self._free: list[Segment] = []
        self._named: dict[str, Segment] = {}  # every segment made and not yet let go, lent or free
        self._lock = threading.Lock()
        self._open = True
        self.made = 0  # segments made so far (the rest of the takes were served again)

    def take(self, nbytes: int) -> tuple[Segment, np.ndarray]:
        """A segment of at least ``nbytes`` bytes and its first ``nbytes`` as a flat ``uint8`` array; the segment
        comes back to the pool when the last view of that array is gone. Raises OSError where shared memory
        cannot hold a new segment."""
        with self._lock:
            segment, surplus = take_fitting(self._free, nbytes, self.spare, lambda segment: segment.size)
        for extra in surplus:  # let go here, on the thread that takes segments
            self._let_go(extra)
        if segment is None:
            segment = _new_segment(self.owner, -(-max(nbytes, 1) // ROUND_BYTES) * ROUND_BYTES)
            with self._lock:
                self._named[segment.name] = segment
            self.made += 1
        lent = np.frombuffer(segment.mapped, dtype=np.uint8, count=nbytes)
        weakref.finalize(lent, self._give_back, segment)
        return segment, lent

    def _give_back(self, segment: Segment) -> None:
        with self._lock:
            if self._open and segment.name in self._named:
                self._free.append(segment)
                return
        self._let_go(segment)

    def _let_go(self, segment: Segment) -> None:
        with self._lock:
            self._named.pop(segment.name, None)
        _remove(segment)

    def clear(self) -> None:
        """Let the spare segments go and remove every name; segments still lent keep their memory until their views
        go, and are not pooled again."""
        with self._lock:
            self._open = False
            named, self._named, self._free = list(self._named.values()), {}, []
        for segment in named:
            _remove(segment)

    def reopen(self) -> None:
        with self._lock:
            self._open = True

    @property
    def spare_segments(self) -> int:
        with self._lock:
            return len(self._free)


def _new_segment(owner: int, size: int) -> Segment:
    """A named segment of ``size`` bytes, sized but not filled: each worker takes its own part's pages."""
    name = f"{SEGMENT_PREFIX}{owner}-{os.getpid()}-pool{next(_made)}"
    return Segment(name, size, sized_segment(name, size))


def _remove(segment: Segment) -> None:
    """The segment's name removed; its memory goes with the last mapping (this process's, once nothing views it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(FOLDER, segment.name))
