"""torch's CPU operations on a thread of the library's own run on that thread alone, not on an intra-op team.

torch runs a large CPU operation (a fill, a copy, a reduction of more than 32,768 elements) on a team of OpenMP
threads as many as the cores, and after each operation the team spins for some milliseconds waiting for the next.
The library's threads in a rank's process (the read-ahead and exchange threads, processing on threads) make such
operations for every micro-batch (collation's padded fields, say): on a 16-core host the read-ahead thread's team
kept 15 threads of the rank's process spinning at more than half a core each, cores the worker processes needed (one
rank's samples/s: 113 with the team, 296 without). Each such thread sets torch's intra-op threads to one for itself,
as torch's ``DataLoader`` sets its pin-memory thread; the training thread, and every other thread, keep torch's
setting as the program made it (with OpenMP the setting is each thread's own; torch's default for threads that have
not yet run an operation is put back at once)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


class _Done(threading.local):
    serial = False  # this thread's torch operations already run on it alone


_done = _Done()


def serial_torch_here() -> None:
    """torch's operations on the calling thread run on it alone from now on; other threads keep theirs (see the
    module doc). Idempotent; cheap after the first call on a thread."""
    if _done.serial:
        return
    _done.serial = True
    wanted = torch.get_num_threads()  # a thread's first call reads the process's setting (torch's default, or the program's)
    if wanted <= 1:
        return
    # torch.set_num_threads sets this thread's OpenMP setting and, as a side effect, torch's setting for threads yet to
    # run an operation: that one is put back from a thread of its own, which ends with it.
    torch.set_num_threads(1)
    restore = threading.Thread(target=torch.set_num_threads, args=(wanted,), name="mimo-pipes-torch-setting", daemon=True)
    restore.start()
    restore.join()


class SerialTorch(Generic[T, R]):
    """``function`` called with torch's operations on the calling thread alone (:func:`serial_torch_here`): what
    threads the library does not start itself (torchdata's mappers) run."""

    def __init__(self, function: Callable[[T], R]) -> None:
        self.function = function

    def __call__(self, item: T) -> R:
        serial_torch_here()
        return self.function(item)

    def __repr__(self) -> str:
        return f"SerialTorch({self.function!r})"
