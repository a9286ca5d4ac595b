"""Imported once by the launcher's rank server (:mod:`~mimo_pipes.cli.job.rank_server`) before it forks any
rank: what every rank of a job imports, so that no rank imports it again. Importing this module is the preload
(multiprocessing's forkserver preloads modules by name only); the launcher says which modules of the job to add,
and on which ``sys.path``, in :data:`~mimo_pipes.cli.job.rank_server.PRELOAD_VARIABLE`.

A module that fails to import here is left out: the rank imports it itself, and says what fails in its one line.
"""

from __future__ import annotations

import json
import os
import sys

from mimo_pipes.cli.job.rank_server import PRELOAD_VARIABLE
from mimo_pipes.samples.preload_modules import PROCESSING, import_frozen

# What a rank of the project's recipes imports, heaviest first: torch, its process groups (through the exchange),
# what processing rows needs (PROCESSING), the graph's nodes and the data sources (each rank imports datasets itself
# when its data is a saved folder: about 0.9 CPU-s).
EVERY_RANK = (
    "torch",
    "mimo_pipes.exchange.world",
    *PROCESSING,
    "mimo_pipes.cli.rank.setup",
    "mimo_pipes.data.sources.saved_folder",
    "mimo_pipes.data.embedded.synthetic",
)


def preload() -> None:
    """Import :data:`EVERY_RANK` and the job's modules. OpenMP reads its thread count when torch loads, so the
    ranks' one intra-op thread is set here (as a spawned rank set it before its own import); the garbage
    collector stays off while the modules load (see :func:`~mimo_pipes.cli.job.launcher.pause_rank_start`) and
    what they built is frozen out of its scans in every rank forked afterwards."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    order = json.loads(os.environ.pop(PRELOAD_VARIABLE, "{}"))
    sys.path[:] = order.get("sys_path", sys.path)
    import_frozen((*EVERY_RANK, *order.get("modules", ())))


preload()
