"""Imported once by the worker server (:mod:`~mimo_pipes.samples.worker_start`) before it forks any worker:
what a worker process of the library imports, so that no worker imports it again (multiprocessing's forkserver
preloads modules by name only; importing this module is the preload).

A module that fails to import here is left out: the worker imports it itself, and says what fails there.
"""

from __future__ import annotations

import gc
import importlib

# What a worker imports, heaviest first: torch, the processor's transformers modules (the image processor's pull
# in transformers' modelling and torch's compiler stack), PIL's image formats, the library's processing and the
# nodes whose workers these are. Not datasets: the pyarrow it loads starts a thread as its library loads, and the
# server forks only while it holds none.
EVERY_WORKER = (
    "torch",
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
    "mimo_pipes.data.processing.processor",
    "mimo_pipes.data.processing.module_processor",
    "mimo_pipes.nodes.row_processor",
)


def preload() -> None:
    """Import :data:`EVERY_WORKER` with the garbage collector off (what they build is frozen out of its scans in
    every worker forked afterwards)."""
    gc.disable()
    for name in EVERY_WORKER:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - left to the worker (see the module's docstring)
            continue
    gc.freeze()
    gc.enable()


preload()
