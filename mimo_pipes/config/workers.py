"""How many processing workers a rank gets when ``num_workers`` is left unset: the cores this rank may use.

A node's ranks share its cores: each takes the cores its process may run on (``os.sched_getaffinity``, which a
job scheduler's CPU binding narrows) divided among the ranks started on the node (``LOCAL_WORLD_SIZE`` as
torchrun sets it; ``WORLD_SIZE`` for ranks ``mimo-pipes run`` spawns on one machine), less the rank's own threads
that stay busy beside the workers (:data:`RANK_THREADS`), and never fewer than one. It is resolved on the rank
(:func:`processing_workers`), where the environment says how many ranks share the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

RANK_THREADS = 2
"""Cores a rank keeps for its own threads: the training thread (which also launches the GPU's work) and the
loader's read-ahead thread (the exchange, collation and, with ``prepare_with``, ``mimo_batch``)."""


def default_workers(cores: int, local_ranks: int, reserved: int = RANK_THREADS) -> int:
    """Workers for one of ``local_ranks`` ranks sharing ``cores``, each keeping ``reserved`` for its own threads."""
    return max(1, cores // max(local_ranks, 1) - reserved)


def rank_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_ranks(environ: Mapping[str, str] = os.environ) -> int:
    """The ranks started on this node: ``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE`` (every rank on this machine, as
    ``mimo-pipes run`` spawns them), else 1 (one process)."""
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def processing_workers(num_workers: int | None) -> int:
    """``num_workers`` as set (at least 1), or, when None, :func:`default_workers` for this rank's cores and node."""
    if num_workers is not None:
        return max(num_workers, 1)
    return default_workers(rank_cores(), local_ranks())


WORKERS_PER_COUNTING_WORKER = 8
"""Processing workers one counting worker keeps up with. Under ``--exchange-payload rows`` a rank counts each row
(its text tokenized, its image headers read) before the exchange and processes it after. Counting costs about a
twentieth of processing (on a 16-core host about 1 ms of CPU a row against 30 ms), so one counting worker serves
several processing workers with room to spare. Counting on threads, each is one more thread beside the training
thread that holds the interpreter lock when the training thread comes back for its next micro-batch; counting on
worker processes (``processing="process"``), each is one more process."""


def counting_workers(workers: int) -> int:
    """The workers that count rows for ``workers`` processing workers: one per :data:`WORKERS_PER_COUNTING_WORKER`
    workers or part of them."""
    return max(1, -(-workers // WORKERS_PER_COUNTING_WORKER))
