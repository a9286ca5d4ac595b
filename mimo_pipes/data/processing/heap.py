"""The C allocator told to keep what processing frees for the next row: :func:`keep_freed_memory`.

Processing a row allocates and frees megabytes at a time on its worker (a decoded image, PIL's resize buffers,
the patches' 8-bit copy). glibc's ``malloc`` maps a block above its mmap threshold straight from the kernel and
unmaps it when freed, and returns the free top of a heap to the kernel past its trim threshold; both start low
(128 KiB) and only rise as large blocks come and go. Whatever is given back is faulted in again, page by page,
on the next row, and the unmaps and faults of every worker thread go through the one memory map of the process.
On a 16-core host at 14 workers that was 1,005 page faults and 3.4 ms of kernel CPU a sample; with both
thresholds fixed, 24 faults and 1.2 ms (docs/benchmarks.md).

The thresholds are fixed once per process, where rows are processed (a processor opened, a worker process
started): the mmap threshold at 32 MiB (glibc's largest) and the trim threshold at 512 MiB. Memory stays bounded:
a heap keeps at most what it once held. Where the allocator is not glibc's, or the environment already sets one
of its malloc settings (``GLIBC_TUNABLES=glibc.malloc...``, ``MALLOC_...``), nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit systems: blocks up to this come from the thread's heap
TRIM_THRESHOLD = 512 << 20  # free memory a heap keeps at its top before giving it back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)

_lock = threading.Lock()
_done: dict[int, bool] = {}  # process id -> whether the thresholds were set (a forked child sets its own)


def user_set(environ: dict[str, str] | os._Environ) -> bool:
    """Whether ``environ`` sets one of glibc's malloc settings itself (then it is left as the user set it)."""
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "") or any(name.startswith("MALLOC_") for name in environ)


def keep_freed_memory() -> bool:
    """Fixes glibc's mmap and trim thresholds in this process (see the module doc), once; whether they are set."""
    pid = os.getpid()
    with _lock:
        if pid not in _done:
            _done[pid] = _set_thresholds()
        return _done[pid]


def _set_thresholds() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or user_set(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
