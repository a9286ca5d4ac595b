"""torchdata 0.11's threads and worker processes stopped in an order that leaves nothing failing behind.

torchdata is in maintenance: these guard its known shutdown bugs, each reproduced by a test."""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any

from torchdata.nodes import BaseNode
from torchdata.nodes import map as torchdata_map

_exiting = False
_open_loaders: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(loader: Any) -> None:
    """Close ``loader`` (its ``close()``) when the interpreter exits, if it is still referenced then: a loader
    that an exception kept from being closed would otherwise still run its threads while the interpreter
    tears down (torch's threads then abort the process now and then: "terminate called without an active
    exception")."""
    _open_loaders.add(loader)


def _at_exit() -> None:
    global _exiting
    for loader in list(_open_loaders):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - a graph that failed may not close cleanly; the process ends anyway
            pass
    _exiting = True


def _quiet_at_exit(cls: type) -> None:
    """torchdata 0.11's mapper iterators (``_ParallelMapperIter``, ``_SingleThreadedMapper``) stop their
    threads in ``__del__``. One still referenced when the interpreter exits (a loader that an exception kept
    from being closed, held by a global or by the traceback) is collected after the modules' globals were
    cleared: its multiprocessing Event's ``set`` then finds ``sys`` gone from ``multiprocessing.synchronize``
    and Python prints ``Exception ignored ... 'NoneType' object has no attribute 'maxsize'``. From the exit
    on, skip it: its threads are daemons, and multiprocessing's own exit hook ends its worker processes (as
    torch's DataLoader skips its ``__del__`` once ``python_exit_status`` is set)."""
    original = cls.__dict__.get("__del__")
    if original is None or getattr(original, "quiet_at_exit", False):
        return

    def __del__(self, _original=original, _finalizing=sys.is_finalizing) -> None:
        if _exiting or _finalizing():
            return
        _original(self)

    __del__.quiet_at_exit = True  # type: ignore[attr-defined]
    cls.__del__ = __del__  # type: ignore[attr-defined]


atexit.register(_at_exit)  # registered after multiprocessing's exit hook, so it runs before it
for _iterator_class in (torchdata_map._ParallelMapperIter, torchdata_map._SingleThreadedMapper):
    _quiet_at_exit(_iterator_class)


def stop_torchdata_threads(node: BaseNode) -> None:
    # torchdata 0.11's ParallelMapper (in the inner node it holds as ``_it``), Prefetcher and PinMemory run
    # their threads in an iterator kept as ``_it`` that stops them only in ``_shutdown()``, called when it
    # is garbage collected or the node is reset; stop them now. The next reset() builds a new iterator.
    iterator = getattr(node, "_it", None)
    shutdown = getattr(iterator, "_shutdown", None)
    if callable(shutdown):
        _stop_readers_first(iterator)
        shutdown()
        _wait_for_worker_processes(iterator)
        node._it = None


def _stop_readers_first(iterator: object) -> None:
    """With worker processes, torchdata's ``_shutdown`` stops the workers while its sort thread may still be
    receiving a worker's result: tensors travel as file descriptors a worker shares until it exits, so a
    thread that outlives the workers fails in the resource sharer (FileNotFoundError). Stop the threads
    that read (the source reader, the sort thread) and wait for them while the workers still run."""
    stop, process_stop = getattr(iterator, "_stop", None), getattr(iterator, "_mp_stop", None)
    if getattr(iterator, "method", None) != "process" or stop is None or process_stop is None:
        return
    stop.set()
    for name in ("_read_thread", "_sort_thread"):
        thread = getattr(iterator, name, None)
        if thread is not None and thread.is_alive():
            thread.join()


def _wait_for_worker_processes(iterator: object, timeout_s: float = 60.0) -> None:
    """torchdata waits a tenth of a second for each worker process; one still starting (importing torch
    takes seconds) then finds the stop event's semaphore gone with its iterator and fails with a traceback.
    Wait until every worker has seen the stop and ended, while the iterator still holds the event."""
    if getattr(iterator, "method", None) != "process":
        return
    for worker in getattr(iterator, "_workers", []):
        join = getattr(worker, "join", None)
        if callable(join):
            join(timeout_s)
