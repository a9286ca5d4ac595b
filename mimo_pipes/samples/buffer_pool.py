"""Micro-batch buffers used again once their micro-batch is gone: :class:`BufferPool`.

A micro-batch's pixels are tens of megabytes (a micro-batch of four samples of the embedded data: 39 MB). Made
fresh for every micro-batch (``torch.empty``), such a buffer is above the size the C allocator keeps in its heap
(32 MB at most), so it is mapped for the micro-batch and unmapped when the micro-batch is dropped: on the
training thread, which drops it, 3.1 ms of CPU a micro-batch on a 2-core machine, each time it asks for the next
one; and the workers fault every page of the next buffer in again. A buffer from the pool goes back to the pool
when the last tensor viewing it is gone (whatever thread drops it: that thread only puts it on a list), and the
next micro-batch's rows are written into memory already mapped. Buffers beyond the few spare ones are let go on
the thread that takes buffers (the one making micro-batches), never on the one that drops them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

SPARE_BUFFERS = 4
"""Buffers kept free beyond those in use: in a steady stream a buffer comes back for each one taken, so a few
spare ones cover a burst of micro-batches handed out together (read-ahead) without keeping memory that no
micro-batch needs."""
ROUND_BYTES = 1 << 20  # capacities are whole MiB, so a micro-batch slightly larger than the last still fits
T = TypeVar("T")  # what a pool lends: a buffer, a shared-memory segment


def take_fitting(free: list[T], nbytes: int, spare: int, size: Callable[[T], int]) -> tuple[T | None, list[T]]:
    """From a pool's ``free`` list (changed in place): the smallest item of at least ``nbytes`` (None if none fits),
    and the items beyond ``spare`` left over, taken off the list for the caller to let go outside its lock."""
    fitting = [i for i, item in enumerate(free) if size(item) >= nbytes]
    item = free.pop(min(fitting, key=lambda i: size(free[i]))) if fitting else None
    surplus = free[spare:]
    del free[spare:]
    return item, surplus


class BufferPool:
    """Flat tensors lent for one micro-batch each and taken back, as memory, when every view of them is gone
    (:meth:`take`). Safe to take from one thread while tensors are dropped on others. :meth:`clear` lets the
    spare buffers go (a buffer still lent goes when its tensors do)."""

    def __init__(self, spare: int = SPARE_BUFFERS) -> None:
        self.spare = spare
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._open = True
        self.made = 0  # buffers allocated so far (the rest of the takes were served again)

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat tensor of ``numel`` elements of ``dtype``, uninitialised (as ``torch.empty``)."""
        nbytes = numel * dtype.itemsize
        with self._lock:
            base, surplus = take_fitting(self._free, nbytes, self.spare, lambda base: base.nbytes)
        del surplus  # unmapped here, on the thread that takes buffers
        if base is None:
            base = np.empty(-(-max(nbytes, 1) // ROUND_BYTES) * ROUND_BYTES, dtype=np.uint8)
            self.made += 1
        lent = base[:nbytes]
        weakref.finalize(lent, self._give_back, base)  # runs when the last tensor over ``lent`` is gone
        return torch.from_numpy(lent).view(dtype)

    def _give_back(self, base: np.ndarray) -> None:
        with self._lock:
            if self._open:
                self._free.append(base)

    def clear(self) -> None:
        """Let the spare buffers go; buffers still lent go when their tensors do."""
        with self._lock:
            self._open = False
            self._free.clear()

    def reopen(self) -> None:
        with self._lock:
            self._open = True

    @property
    def spare_buffers(self) -> int:
        with self._lock:
            return len(self._free)
