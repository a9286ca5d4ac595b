"""Imported once by the worker server (:mod:`~mimo_pipes.samples.worker_start`) before it forks any worker:
what a worker process of the library imports, so that no worker imports it again (multiprocessing's forkserver
preloads modules by name only; importing this module is the preload).

A module that fails to import here is left out: the worker imports it itself, and says what fails there.
"""

from __future__ import annotations

from mimo_pipes.samples.preload_modules import PROCESSING, import_frozen

# What a worker imports, heaviest first: torch, what processing rows needs (PROCESSING), the library's processing
# and the nodes whose workers these are.
EVERY_WORKER = (
    "torch",
    *PROCESSING,
    "mimo_pipes.data.processing.processor",
    "mimo_pipes.data.processing.module_processor",
    "mimo_pipes.nodes.row_processor",
)

import_frozen(EVERY_WORKER)  # what they build is frozen out of the garbage collector's scans in every worker
