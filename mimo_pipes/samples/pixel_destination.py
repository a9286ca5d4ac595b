"""Where a worker thread's next row of pixels goes: straight into its slice of the micro-batch's buffer.

RowProcessor's worker threads write each row's ``pixel_values`` into its rows of one buffer made for the
micro-batch (:func:`~mimo_pipes.samples.collate.lend_rows`). With :func:`pixels_into` around a row's processing,
the processing that lays the pixels out (the pixel table, ``data/processing/fast_pixels.py``) writes them there
itself (:func:`taken_destination`) instead of into an array of its own that is then copied there: a copy of every
pixel saved (about a tenth of a heavy row's processing).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class _Destination(threading.local):
    """Per thread: where the next row's pixels go (None: an array of their own)."""

    out: np.ndarray | None = None


_destination = _Destination()


@contextmanager
def pixels_into(out: np.ndarray | None) -> Iterator[None]:
    """While in it, the next row's pixels made on this thread go into ``out`` (``[rows, width]`` float32,
    C-contiguous) when they have exactly its shape (see :func:`taken_destination`)."""
    previous = _destination.out
    _destination.out = out
    try:
        yield
    finally:
        _destination.out = previous


def taken_destination(rows: int, width: int) -> np.ndarray | None:
    """The array this thread's pixels of ``rows`` x ``width`` float32 go into, taken once (a second call makes
    its own); None where there is none, or it is not exactly that."""
    out = _destination.out
    if out is None or out.shape != (rows, width) or out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        return None
    _destination.out = None
    return out
