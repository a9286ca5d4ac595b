"""The launcher's rank server: multiprocessing's forkserver, whose one process imports once what every rank
imports (torch, the processor's transformers modules, the job's rank and recipe modules: :mod:`rank_preload`),
so that each rank is forked from it already imported, instead of starting a fresh interpreter that imports them
all again (``spawn``: some 5 CPU-s a rank). The server holds no thread and has run no torch operation when it
forks, so a fork is as safe there as a fresh start.

The server lives for one launch: started before the first rank, stopped once every rank is gone. Its children
get a copy of its "alive" pipe from multiprocessing (so that a server outlives its last client); a rank closes
its copy first thing (:func:`leave_rank_server`), so that the server ends as soon as the launcher does, however
the launcher ends, and each rank with the server (a rank asks for SIGKILL when its parent dies).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from multiprocessing import forkserver, util
from multiprocessing.context import BaseContext

PRELOAD_MODULE = "mimo_pipes.cli.job.rank_preload"
PRELOAD_VARIABLE = "MIMO_PIPES_RANK_PRELOAD"  # what the server imports, and from where (JSON), read by rank_preload


def start_rank_server(modules: Iterable[str | None]) -> BaseContext:
    """Start this launch's rank server, which imports :mod:`rank_preload`'s modules and ``modules`` (names;
    None skipped) on this process's ``sys.path``; the context whose processes it forks. A server already
    running in this process (started for other work, without this job's modules) is stopped first."""
    import multiprocessing

    stop_rank_server()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([PRELOAD_MODULE])
    order = {"sys_path": [entry for entry in sys.path if isinstance(entry, str)],
             "modules": [name for name in modules if name]}
    os.environ[PRELOAD_VARIABLE] = json.dumps(order)
    try:
        forkserver.ensure_running()  # returns at once: the server imports while the launcher goes on
    finally:
        del os.environ[PRELOAD_VARIABLE]
    return context


def rank_server_running() -> bool:
    """Whether this process has a rank server running (multiprocessing offers no public way to ask)."""
    return forkserver._forkserver._forkserver_pid is not None


def stop_rank_server(timeout_s: float = 5.0) -> None:
    """Ask the rank server to end (its alive pipe closed) and wait for it, killing it past ``timeout_s``, so
    that no process of the job outlives the launcher. Nothing when none runs."""
    server = forkserver._forkserver
    with server._lock:
        fd, pid, address = server._forkserver_alive_fd, server._forkserver_pid, server._forkserver_address
        if pid is None:
            return
        server._forkserver_alive_fd = server._forkserver_pid = server._forkserver_address = None  # a later use starts one
        os.close(fd)
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.01)
        if address and not util.is_abstract_socket_namespace(address):  # a socket file
            with contextlib.suppress(OSError):
                os.unlink(address)


def leave_rank_server() -> None:
    """In a rank the server forked: let go of the server's alive pipe (see the module's docstring). A later
    forkserver in the rank (for its own workers) is a new one."""
    server = forkserver._forkserver
    fd = server._forkserver_alive_fd
    server._forkserver_alive_fd = server._forkserver_address = None
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
