"""torchdata 0.11's threads and worker processes stopped in an order that leaves nothing failing behind.

torchdata is in maintenance: these guard its known shutdown bugs, each reproduced by a test. They know
torchdata's own classes by type (its private ones included: the only way to reach its threads)."""

from __future__ import annotations

import atexit
import os
import queue
import sys
import time
from multiprocessing.context import BaseContext
from typing import Any

from torchdata.nodes import BaseNode, ParallelMapper, PinMemory, Prefetcher
from torchdata.nodes.map import _ParallelMapperImpl, _ParallelMapperIter, _SingleThreadedMapper

from mimo_pipes.samples import handover

_THREADED = (_ParallelMapperImpl, Prefetcher, PinMemory)
WAKE_WAIT_S = 0.5
"""The longest :func:`wake_mapper_threads` waits for busy workers to take their stop (torchdata's join waits as long)."""

_exiting = False
_open_loaders: dict[int, type] = {}
"""Loaders started and not closed yet: their ids and types, no reference (a loader dropped unclosed is still
collected, and torchdata stops its threads then); one still alive at the interpreter's exit is closed."""
_quieted: set[type] = set()


def close_at_exit(loader: Any) -> None:
    """Close ``loader`` (its ``close()``) when the interpreter exits, if it is still alive and open then: a loader
    that an exception kept from being closed would otherwise still run its threads while the interpreter tears
    down (torch's threads then abort the process now and then: "terminate called without an active exception").
    The loader's ``close()`` calls :func:`forget_at_exit`."""
    _open_loaders[id(loader)] = type(loader)


def forget_at_exit(loader: Any) -> None:
    """``loader`` was closed: nothing is left to close at exit."""
    _open_loaders.pop(id(loader), None)


def _at_exit() -> None:
    global _exiting
    if _open_loaders:  # only then: the collector's objects are looked through once, for the loaders still alive
        import gc

        alive = [obj for obj in gc.get_objects() if _open_loaders.get(id(obj)) is type(obj)]
        for loader in alive:
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
    original = vars(cls).get("__del__")
    if original is None or cls in _quieted:
        return

    def __del__(self, _original=original, _finalizing=sys.is_finalizing) -> None:
        if _exiting or _finalizing():
            return
        _original(self)

    _quieted.add(cls)
    cls.__del__ = __del__  # type: ignore[attr-defined]


atexit.register(_at_exit)  # registered after multiprocessing's exit hook, so it runs before it
for _iterator_class in (_ParallelMapperIter, _SingleThreadedMapper):
    _quiet_at_exit(_iterator_class)


def stop_torchdata_threads(node: BaseNode) -> None:
    # torchdata 0.11's ParallelMapper (in the inner node it reads through), Prefetcher and PinMemory run
    # their threads in an iterator kept as ``_it`` that stops them only in ``_shutdown()``, called when it
    # is garbage collected or the node is reset; stop them now. The next reset() builds a new iterator.
    if not isinstance(node, _THREADED) or node._it is None:
        return
    iterator = node._it
    if isinstance(iterator, _ParallelMapperIter):
        _stop_readers_first(iterator)
        wake_mapper_threads(iterator)
    iterator._shutdown()
    if isinstance(iterator, _ParallelMapperIter):
        _wait_for_worker_processes(iterator)
    node._it = None


def start_workers_from(mapper: ParallelMapper, context: BaseContext) -> None:
    """Start ``mapper``'s worker processes from ``context`` (the library's server, :mod:`worker_start`).
    torchdata 0.11 takes a context only by name and keeps it on the mapper's inner ``_ParallelMapperImpl``: a
    context set on the ``ParallelMapper`` is never read, and its workers are then forked from this process
    on Linux (threads, CUDA and all). Called before the mapper first starts; a torchdata whose mapper is
    laid out otherwise is refused here rather than left to fork."""
    inner = mapper._it
    if not isinstance(inner, _ParallelMapperImpl) or mapper.method != "process":
        raise TypeError(f"expected torchdata 0.11's process ParallelMapper (a _ParallelMapperImpl inside), got {type(inner).__name__}")
    inner._mp_context = context


def wake_mapper_threads(iterator: _ParallelMapperIter) -> None:
    """Stop a thread-method mapper's worker threads and its sort thread now, rather than when their poll of an
    empty queue next times out: torchdata's ``_shutdown`` joins them one after another, each waking a tenth of a
    second after the stop at worst (a close of a graph waited about 60 ms a mapper). The items read ahead and not
    yet mapped are dropped first (a stopped worker maps every item left in its queue, for an iterator no one reads
    again: the loader makes what was read ahead again when it resumes). The workers are then handed a
    ``StopIteration`` each, one at a time (a worker passes it on without calling the map function and ends once it
    finds the stop set and the queue empty: two at once could both go to one worker), and the sort thread an item
    of index -1, which no consumer asks for. The read thread is left to its poll: waking it would read one more
    item from the source."""
    if iterator.method != "thread":
        return
    iterator._stop.set()
    iterator._mp_stop.set()
    try:
        while True:
            iterator._in_q.get_nowait()
    except queue.Empty:
        pass
    # Bounded as torchdata bounds its own wait for each thread: a worker stuck in its map function is left to it.
    deadline = time.monotonic() + WAKE_WAIT_S
    for _ in iterator._workers:
        if not any(worker.is_alive() for worker in iterator._workers):
            break
        iterator._in_q.put((StopIteration(), -1))
        while not iterator._in_q.empty() and any(worker.is_alive() for worker in iterator._workers):
            if time.monotonic() > deadline:
                break
            time.sleep(0.0005)  # taken by a waiting worker at once; by a busy one when its item is mapped
    if iterator.in_order:
        iterator._intermed_q.put((None, -1))


def _stop_readers_first(iterator: _ParallelMapperIter) -> None:
    """With worker processes, torchdata's ``_shutdown`` stops the workers while its sort thread may still be
    receiving a worker's result: tensors travel as file descriptors a worker shares until it exits, so a
    thread that outlives the workers fails in the resource sharer (FileNotFoundError). Stop the threads
    that read (the source reader, the sort thread) and wait for them while the workers still run."""
    if iterator.method != "process":
        return
    iterator._stop.set()
    for thread in (iterator._read_thread, iterator._sort_thread):
        if thread.is_alive():
            thread.join()


def _wait_for_worker_processes(iterator: _ParallelMapperIter, timeout_s: float = 60.0) -> None:
    """torchdata waits a tenth of a second for each worker process; one still starting (importing torch
    takes seconds) then finds the stop event's semaphore gone with its iterator and fails with a traceback.
    Wait until every worker has seen the stop and ended, while the iterator still holds the event."""
    if iterator.method != "process":
        return
    for worker in iterator._workers:
        worker.join(timeout_s)
        # What it made and no one received (read ahead, dropped with its queue) is still named: removed now.
        handover.sweep(os.getpid(), worker.pid)
