"""Imported once by the launcher's rank server (:mod:`~mimo_pipes.cli.job.rank_server`) before it forks any
rank: what every rank of a job imports, so that no rank imports it again. Importing this module is the preload
(multiprocessing's forkserver preloads modules by name only); the launcher says which modules of the job to add,
and on which ``sys.path``, in :data:`~mimo_pipes.cli.job.rank_server.PRELOAD_VARIABLE`.

A module that fails to import here is left out: the rank imports it itself, and says what fails in its one line.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys

from mimo_pipes.cli.job.rank_server import PRELOAD_VARIABLE

# What a rank of the project's recipes imports, heaviest first: torch, its process groups (through the exchange), the processor's
# transformers modules (the image processor's pull in transformers' modelling and torch's compiler stack; the
# built-in processor's own), PIL's image formats, the graph's nodes and the data sources. Not datasets: the
# pyarrow it loads starts a thread (jemalloc's) as its library loads, and the server forks only while it holds
# none (each rank imports datasets itself when its data is a saved folder: about 0.9 CPU-s).
EVERY_RANK = (
    "torch",
    "mimo_pipes.exchange.world",
    "transformers",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.auto.image_processing_auto",
    "transformers.image_processing_utils",
    "transformers.image_processing_backends",
    "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
    "PIL.Image",
    "PIL.JpegImagePlugin",
    "PIL.PngImagePlugin",
    "torchdata.nodes",
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
    gc.disable()
    for name in (*EVERY_RANK, *order.get("modules", ())):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - left to the rank (see the module's docstring)
            continue
    gc.freeze()
    gc.enable()


preload()
