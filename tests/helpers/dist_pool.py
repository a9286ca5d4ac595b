"""A pool of real torch.distributed (Gloo) worker processes that run many scenarios in one process group.

Starting torch processes is slow on a small machine, so a test module starts one pool and submits
scenarios to it. Every scenario runs on every rank (collectives need all of them); a scenario whose
layout needs fewer ranks leaves the rest idle. A task that does not finish in time kills the pool.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

# Scenarios live in the helpers folder and in the test modules of every tier: a worker unpickles them by name.
TESTS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_DIRS = [os.path.join(TESTS_ROOT, tier) for tier in ("helpers", "unit", "distributed", "launch")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, connection: Any, backend: str) -> None:
    from mimo_pipes.cli.job.launcher import pause_rank_start, rank_started

    pause_rank_start()  # torch's import, as a rank's start: frozen out of the collector's scans once the group is up
    sys.path[:0] = TEST_DIRS
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if "nccl" in backend:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    rank_started()
    connection.send(("ready", rank))
    while True:
        task = connection.recv()
        if task is None:
            break
        module_name, function_name, args, kwargs = task
        try:
            function = getattr(importlib.import_module(module_name), function_name)
            outcome = ("ok", function(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - reported to the test process
            outcome = ("error", f"rank {rank}: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        _destroy_subgroups(dist)
        connection.send(outcome)
    dist.destroy_process_group()


def _destroy_subgroups(dist: Any) -> None:
    """Every group a scenario made, destroyed on every rank before the next: each Gloo group keeps its
    own threads, and hundreds of scenarios left over a thousand per rank, slowing every later one."""
    from torch.distributed import distributed_c10d

    for group in list(distributed_c10d._world.pg_map):  # no public listing of the groups made
        if group is not distributed_c10d.GroupMember.WORLD:
            dist.destroy_process_group(group)


PRELOAD = tuple(name for name in os.environ.get("MIMO_PIPES_TEST_POOL_PRELOAD", "").split(",") if name)
"""Modules the rank server imports too, besides a launch's (comma-separated; scripts/test312.sh names the Megatron
scenarios'): every rank of every pool starts with them imported, instead of importing transformers and
megatron-core itself, some 8 CPU-s a rank."""


_selected_preload: list[str] = []


def preload(modules: Iterable[str]) -> None:
    """More modules for the rank server to import (those the selected tests' scenarios import in every rank, such as
    megatron-core for the routing scenarios): called before the first pool starts, once the run's tests are known."""
    _selected_preload.extend(name for name in modules if name not in _selected_preload)


def _rank_server() -> Any:
    """The context that starts the pool's ranks: forked by the launcher's rank server (torch, transformers and the
    job's modules imported once for every rank, as a launch's ranks are), one for every pool of the test run."""
    from mimo_pipes.cli.job.rank_server import rank_server_running, start_rank_server

    if not rank_server_running():
        return start_rank_server(["mimo_pipes.cli.rank.run_rank", "mimo_pipes_recipes.vlm_sft", "dist_pool", *PRELOAD, *_selected_preload])
    return mp.get_context("forkserver")


class DistPool:
    """``world_size`` ranks (Gloo by default; ``"cpu:gloo,cuda:nccl"`` on GPUs); ``run(fn, ...)`` calls ``fn``
    on every rank and returns the results by rank."""

    def __init__(self, world_size: int, start_timeout: float = 180.0, backend: str = "gloo", daemon: bool = True) -> None:
        """``daemon`` False: ranks that may start processes of their own (a daemonic process may not), such as
        megatron-core's checkpoint writer; such a pool must be closed, as every fixture here does."""
        context = _rank_server()
        port = free_port()
        self.world_size = world_size
        self.connections = []
        self.processes = []
        for rank in range(world_size):
            parent, child = context.Pipe()
            process = context.Process(target=_worker, args=(rank, world_size, port, child, backend), daemon=daemon)
            process.start()
            self.connections.append(parent)
            self.processes.append(process)
        for connection in self.connections:
            if not connection.poll(start_timeout):
                self.close()
                raise TimeoutError("distributed workers did not start")
            connection.recv()

    def run(self, function: Callable, *args: Any, timeout: float = 300.0, **kwargs: Any) -> list[Any]:
        task = (function.__module__, function.__name__, args, kwargs)
        for connection in self.connections:
            connection.send(task)
        results, errors = [], []
        for rank, connection in enumerate(self.connections):
            if not connection.poll(timeout):
                self.close()
                raise TimeoutError(f"rank {rank} did not finish {function.__name__} within {timeout}s")
            status, value = connection.recv()
            results.append(value)
            if status == "error":
                errors.append(value)
        if errors:
            raise ScenarioError(errors)
        return results

    def run_collect(self, function: Callable, *args: Any, timeout: float = 300.0, **kwargs: Any) -> list[tuple[str, Any]]:
        """Like run, but returns (status, value) per rank instead of raising on errors."""
        task = (function.__module__, function.__name__, args, kwargs)
        for connection in self.connections:
            connection.send(task)
        outcomes = []
        for connection in self.connections:
            if not connection.poll(timeout):
                outcomes.append(("timeout", None))
                continue
            try:
                outcomes.append(connection.recv())
            except EOFError:
                outcomes.append(("exited", None))
        return outcomes

    @property
    def alive(self) -> bool:
        return all(process.is_alive() for process in self.processes)

    def close(self) -> None:
        for connection in self.connections:
            try:
                connection.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


class ScenarioError(AssertionError):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


# Enough ranks for every layout the multi-rank tests use (two modules of up to dp 4 + 2, or tp/pp 2).
GLOO_WORLD = int(os.environ.get("MIMO_PIPES_TEST_POOL_RANKS", "6"))
"""Ranks of the shared pool: 6 serve every scenario; the launch tier's jobs need 3 (CI sets this for it, so that
its pool starts three fewer processes beside the other tier's)."""
_shared: dict[str, DistPool] = {}


def shared_pool() -> DistPool:
    """One pool of real Gloo ranks for the whole test run: starting torch processes is slow here. A scenario
    that needs fewer ranks leaves the rest idle. A pool that died (a timed-out scenario closes it) is
    replaced, so one failure does not fail every test after it. Module-scoped fixtures call this directly."""
    pool = _shared.get("pool")
    if pool is None or not pool.alive:
        # Not daemonic: its ranks process on worker processes where a scenario asks for two workers or more
        # (processing auto), as a launcher's ranks do.
        pool = _shared["pool"] = DistPool(GLOO_WORLD, daemon=False)
    return pool


def exact_pool(size: int) -> DistPool:
    """A pool of exactly ``size`` ranks for the whole test run (the shared pool when that is its size), for
    scenarios whose collectives span the whole world (megatron-core's optimizers gather over it): each module that
    asks for a size finds its ranks warm. Not daemonic: megatron-core's checkpoint writer, which Megatron-Bridge's
    save calls, starts a process of its own. Replaced when it died, closed with the shared pool."""
    if size == GLOO_WORLD:
        return shared_pool()
    key = f"exact {size}"
    pool = _shared.get(key)
    if pool is None or not pool.alive:
        pool = _shared[key] = DistPool(size, daemon=False)
    return pool


def close_shared_pool() -> None:
    """Every pool of the run: the shared one and those of :func:`exact_pool`; then the rank server."""
    from mimo_pipes.cli.job.rank_server import stop_rank_server

    for key in list(_shared):
        _shared.pop(key).close()
    stop_rank_server()
