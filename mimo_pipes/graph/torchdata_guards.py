"""torchdata 0.11's threads and worker processes stopped in an order that leaves nothing failing behind.

torchdata is in maintenance: these guard its known shutdown bugs, each reproduced by a test. They know
torchdata's own classes by type (its private ones included: the only way to reach its threads)."""

from __future__ import annotations

from torchdata.nodes import BaseNode, PinMemory, Prefetcher
from torchdata.nodes.map import _ParallelMapperImpl, _ParallelMapperIter

_THREADED = (_ParallelMapperImpl, Prefetcher, PinMemory)


def stop_torchdata_threads(node: BaseNode) -> None:
    # torchdata 0.11's ParallelMapper (in the inner node it reads through), Prefetcher and PinMemory run
    # their threads in an iterator kept as ``_it`` that stops them only in ``_shutdown()``, called when it
    # is garbage collected or the node is reset; stop them now. The next reset() builds a new iterator.
    if not isinstance(node, _THREADED) or node._it is None:
        return
    iterator = node._it
    if isinstance(iterator, _ParallelMapperIter):
        _stop_readers_first(iterator)
    iterator._shutdown()
    if isinstance(iterator, _ParallelMapperIter):
        _wait_for_worker_processes(iterator)
    node._it = None


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
