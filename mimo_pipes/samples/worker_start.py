"""How the library's worker processes start (``processing="process"``, ``mimo-pipes check``'s and ``analyze``'s
pools): forked from a server of the library's own, multiprocessing's forkserver, whose one process imported
torch, transformers and the processing modules once (:mod:`worker_preload`), instead of a fresh interpreter
per worker that imports them all again (``spawn``: some 5 CPU-s a worker). The server is a fresh interpreter
that holds no thread and has run no torch operation when it forks, so a fork there is as safe as a fresh start.

A worker gets what a spawned one gets: its function and arguments pickled (what cannot be pickled fails as
with ``spawn``, in the process that starts the pool), this process's ``sys.path`` and working folder, its
main module imported as ``__mp_main__``, and this process's environment as it is when the worker starts; torch
runs its operations on the worker's own thread (:func:`one_thread_per_worker`), as in ``DataLoader``'s workers.

The server is this process's own, apart from multiprocessing's forkserver (which the program, or the launcher's
rank server, may run for its own processes): started by the first worker, it lives until this process and every
worker it forked have ended. A process forked from this one starts a server of its own. Where there is no
forkserver (Windows), or where its start differs from the Pythons tested (3.11, 3.12), workers are spawned.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
from multiprocessing.context import BaseContext, reduction, set_spawning_popen
from typing import Any

PRELOAD_MODULE = "mimo_pipes.samples.worker_preload"


def one_thread_per_worker() -> None:
    """torch's operations in this worker process on its own thread, as torch's ``DataLoader`` sets its workers:
    a large copy or operation otherwise runs on a team of intra-op threads as many as the cores, in every worker
    at once (14 workers: 224 threads on 16 cores, spinning after each operation)."""
    import torch

    torch.set_num_threads(1)


def worker_context() -> BaseContext:
    """The multiprocessing context the library's worker processes start from (see the module doc)."""
    if _SERVER is None:
        return multiprocessing.get_context("spawn")
    return _CONTEXT


# The server's start below follows multiprocessing's own forkserver start as Python 3.11 and 3.12 write it (the
# versions tested); elsewhere (3.14 authenticates the server's connections) workers are spawned.
if "forkserver" in multiprocessing.get_all_start_methods() and (3, 11) <= sys.version_info[:2] <= (3, 12):
    from multiprocessing import forkserver, popen_forkserver, spawn, util
    from multiprocessing.context import ForkServerContext, ForkServerProcess

    _SERVER: Any = forkserver.ForkServer()
    _SERVER.set_forkserver_preload([PRELOAD_MODULE])

    def _forget_server() -> None:
        """In a process forked from this one: its parent's server is not its child; it starts its own."""
        global _SERVER
        alive = _SERVER._forkserver_alive_fd
        if alive is not None:
            try:
                os.close(alive)  # the server ends with the process that started it, not with this copy
            except OSError:
                pass
        _SERVER = forkserver.ForkServer()
        _SERVER.set_forkserver_preload([PRELOAD_MODULE])

    os.register_at_fork(after_in_child=_forget_server)

    class _WorkerPopen(popen_forkserver.Popen):
        """multiprocessing's forkserver start, asking this module's server rather than multiprocessing's own."""

        def _launch(self, process_obj: Any) -> None:
            prep_data = spawn.get_preparation_data(process_obj._name)
            buf = io.BytesIO()
            set_spawning_popen(self)
            try:
                reduction.dump(prep_data, buf)
                reduction.dump(process_obj, buf)
            finally:
                set_spawning_popen(None)
            self.sentinel, w = _SERVER.connect_to_new_process(self._fds)
            parent_w = os.dup(w)  # the child's sign that this process is alive, as multiprocessing keeps it
            self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)

    class _WorkerProcess(ForkServerProcess):
        """A worker process: its environment is this process's when it starts (the server's is the one it started with)."""

        @staticmethod
        def _Popen(process_obj: Any) -> _WorkerPopen:
            process_obj._environment = dict(os.environ)
            return _WorkerPopen(process_obj)

        def run(self) -> None:
            environment = getattr(self, "_environment", None)
            if environment is not None:
                os.environ.clear()
                os.environ.update(environment)
            one_thread_per_worker()
            super().run()

    class _WorkerContext(ForkServerContext):
        Process = _WorkerProcess

    _CONTEXT: BaseContext = _WorkerContext()
else:  # pragma: no cover - Windows, and Pythons whose forkserver start differs
    _SERVER = None
