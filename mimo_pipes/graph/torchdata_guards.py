"""torchdata 0.11's threads and worker processes stopped in an order that leaves nothing failing behind.

torchdata is in maintenance: these guard its known shutdown bugs, each reproduced by a test."""

from __future__ import annotations

from torchdata.nodes import BaseNode


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
