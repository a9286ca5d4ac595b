"""How the library's worker processes start (``processing="process"``, ``mimo-pipes check``'s and ``analyze``'s
pools): forked from a server of the library's own, multiprocessing's forkserver, whose one process imported
torch, transformers and the processing modules once (:mod:`worker_preload`), instead of a fresh interpreter
per worker that imports them all again (``spawn``: some 5 CPU-s a worker). The server is a fresh interpreter
that holds no thread and has run no torch operation when it forks, so a fork there is as safe as a fresh start.

A worker gets what a spawned one gets: its function and arguments pickled (what cannot be pickled fails as
with ``spawn``, in the process that starts the pool), this process's ``sys.path`` and working folder, and this
process's environment as it is when the worker starts; torch runs its operations on the worker's own thread
(:func:`one_thread_per_worker`), as in ``DataLoader``'s workers. Unlike a spawned worker, it imports the main
module (as ``__mp_main__``, running its top level again) only where its function or arguments name something
of it (:func:`refers_to_main`): a script that builds the library's graph needs no ``if __name__ == "__main__":``
guard, while one whose own map function the workers run does, as with ``spawn``.

The server is this process's own, apart from multiprocessing's forkserver (which the program, or the launcher's
rank server, may run for its own processes): started by the first worker, it lives until this process and every
worker it forked have ended. A process forked from this one starts a server of its own. Where there is no
forkserver (Windows), or where its start differs from the Pythons tested (3.11, 3.12), workers are spawned.
"""

from __future__ import annotations

import ast
import functools
import io
import multiprocessing
import os
import pickletools
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


# What a worker's preparation says of the main module: imported (as ``__mp_main__``, running its top level again)
# only where the worker's pickled function or arguments name something of it.
MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


def refers_to_main(pickled: bytes) -> bool:
    """Whether a pickle may name an object of the main module: a global is pickled as its module's name and its
    own, so one of ``__main__`` leaves that name in the bytes (a string that merely holds it only imports the main
    module as every spawned worker does)."""
    return b"__main__" in pickled


def main_names(pickled: bytes) -> list[str]:
    """The names of the main module's objects a pickle refers to (what a worker would look up there)."""
    names, after_main = [], False
    for opcode, argument, _ in pickletools.genops(pickled):
        if opcode.name == "GLOBAL" and isinstance(argument, str) and argument.startswith("__main__ "):
            names.append(argument.split(" ", 1)[1])
        elif isinstance(argument, str):
            if after_main:
                names.append(argument)
            after_main = argument == "__main__"
    return list(dict.fromkeys(names))


def unguarded_main() -> str | None:
    """The main module's file when importing it would run the program again: a script (or ``-m`` module) whose
    top level has no ``if __name__ == "__main__":``. A worker that must import it (:func:`refers_to_main`)
    would start the program's own workers while it starts, which multiprocessing refuses; None otherwise
    (a guarded script, an interactive session, a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    return None if _guarded(os.path.abspath(path)) else path


@functools.lru_cache(maxsize=8)
def _guarded(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return True  # unreadable: as multiprocessing would, let the worker try
    for statement in tree.body:
        if isinstance(statement, ast.If) and isinstance(test := statement.test, ast.Compare) and len(test.comparators) == 1:
            sides = (test.left, test.comparators[0])
            names = {side.id for side in sides if isinstance(side, ast.Name)}
            texts = {side.value for side in sides if isinstance(side, ast.Constant)}
            if names == {"__name__"} and texts == {"__main__"}:
                return True
    return False


def main_rerun_problem(what: str) -> str | None:
    """The one-line refusal for worker processes that must import an unguarded main module (see
    :func:`unguarded_main`) to run ``what``; None where they may."""
    path = unguarded_main()
    if path is None:
        return None
    return (f"worker processes (processing='process') run {what} of {path}, the program's main module, so each imports it and "
            f"would run the program again: put its start under `if __name__ == \"__main__\":`, move {what} into a module, "
            f"or process on threads (processing='thread')")


def forked_workers() -> bool:
    """Whether workers start from the library's server here (else they are spawned: see the module doc)."""
    return _SERVER is not None


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
            buf, work = io.BytesIO(), io.BytesIO()
            set_spawning_popen(self)
            try:
                reduction.dump(process_obj, work)
                pickled = work.getvalue()
                if not refers_to_main(pickled):
                    for key in MAIN_KEYS:
                        prep_data.pop(key, None)
                elif (problem := main_rerun_problem(", ".join(main_names(pickled)) or "an object")) is not None:
                    raise RuntimeError(problem)  # here, in this process: the worker would fail while starting, unseen
                reduction.dump(prep_data, buf)
            finally:
                set_spawning_popen(None)
            buf.write(pickled)
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
