"""torch's CPU operations on a thread of the library's own run on that thread alone, not on an intra-op team.

torch runs a large CPU operation (a fill, a copy, a reduction of more than 32,768 elements) on a team of OpenMP
threads as many as the cores, and after each operation the team spins for some milliseconds waiting for the next.
The library's threads in a rank's process (the read-ahead and exchange threads, RowProcessor's worker threads) make such
operations for every micro-batch (collation's padded fields, say): on a 16-core host the read-ahead thread's team
kept 15 threads of the rank's process spinning at more than half a core each, cores the worker processes needed (one
rank's samples/s: 113 with the team, 296 without). Each such thread sets its own OpenMP thread count to one, as
torch's ``DataLoader`` sets its pin-memory thread's. It does so through the OpenMP runtime torch's kernels run on, not
``torch.set_num_threads``: that one also changes torch's setting for every thread yet to run its first operation (and
such a thread writes what it read back as that setting), so threads starting beside the library's could keep one
thread for good. The training thread, and every other thread, keep torch's setting as the program made it. Where torch
does not run its kernels on OpenMP its thread count is the whole process's, and the library leaves it alone.
torchdata's mapper threads set theirs to one themselves, with ``torch.set_num_threads``: the loader guards the thread
that starts it against that (:func:`own_torch_setting_here`)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch

LIBRARIES = ("libtorch_cpu.so", "libtorch_cpu.dylib")  # what torch's kernels are in; their OpenMP runtime is its dependency


@functools.cache
def _openmp_thread_count() -> Callable[[int], object] | None:
    """``omp_set_num_threads`` of the OpenMP runtime torch's kernels run on (it sets the calling thread's count
    only); None where torch does not run them on OpenMP or its runtime cannot be reached."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    folder = Path(torch.__file__).parent / "lib"
    for name in LIBRARIES:
        if (folder / name).exists():
            try:  # looked up from torch's own library: the runtime it is linked with, whatever else the process loaded
                return ctypes.CDLL(str(folder / name)).omp_set_num_threads
            except (OSError, AttributeError):
                return None
    return None


def serial_torch_here() -> None:
    """torch's operations on the calling thread run on it alone from now on; other threads keep theirs (see the
    module doc). Called again on the thread, it finds one thread and does nothing."""
    # torch sets a thread's count up at its first operation or question, which would undo ours: asked first.
    if torch.get_num_threads() <= 1:
        return
    set_count = _openmp_thread_count()
    if set_count is not None:
        set_count(1)


def own_torch_setting_here() -> None:
    """The calling thread's torch setting made its own now, as the program has it. torchdata's mapper threads call
    ``torch.set_num_threads(1)``, which also sets torch's setting for every thread yet to run its first operation
    (torch sets a thread up then): a training thread whose first operation came after the loader's mappers started
    would keep one thread for good. The loader asks on the thread that starts it, before any of its threads start."""
    torch.get_num_threads()
