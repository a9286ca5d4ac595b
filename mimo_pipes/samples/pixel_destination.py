"""Where a row's pixels go, offered to the code that makes them: :func:`pixels_into` and :func:`take_destination`.

RowProcessor gives each row's pixels a slice of its micro-batch's buffer. Processing that lays the pixels out
itself (:mod:`mimo_pipes.data.processing.fast_pixels`) writes them straight into that slice, instead of into an
array of its own that is copied into the slice afterwards: the fresh array (24 MB for a 1 MP image at two
temporal frames) costs its page faults, and the copy moves every byte again. Both run on every processing
thread at once, where the faults contend for the process's memory map.

The slice is offered for one call on the offering thread. Code that cannot use it (another shape or dtype, the
image processor's own path, videos) leaves it alone, and the caller copies as before; code that takes it writes
every row of it or fails (a failed row is replaced, and its slice is not read).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class _Offer(threading.local):
    target: np.ndarray | None = None


_offer = _Offer()


@contextmanager
def pixels_into(target: np.ndarray | None) -> Iterator[None]:
    """Offers ``target`` (a writable, C-contiguous ``[rows, width]`` array) to the pixels made on this thread
    inside the block; withdrawn when the block ends, taken or not."""
    _offer.target = target
    try:
        yield
    finally:
        _offer.target = None


def take_destination(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray | None:
    """The offered array when it has exactly ``shape`` and ``dtype`` (then the offer is used up: a second field
    made in the same call gets its own array), else None."""
    target = _offer.target
    if target is None or target.shape != tuple(shape) or target.dtype != np.dtype(dtype):
        return None
    _offer.target = None
    return target
