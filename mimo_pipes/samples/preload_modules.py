"""What a preloading server imports before it forks (the launcher's rank server, the library's worker server), and
how: :data:`PROCESSING` and :func:`import_frozen`."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterable

# The processor's transformers modules (the image processor's pull in transformers' modelling and torch's compiler
# stack; the built-in processor's own), PIL's image formats and torchdata's nodes: what a rank and a worker process
# both import to process rows. Not datasets: the pyarrow it loads starts a thread as its library loads, and a
# server forks only while it holds none.
PROCESSING = (
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
)


def import_frozen(names: Iterable[str]) -> None:
    """Import ``names`` with the garbage collector off, then freeze what they built out of its scans (in every
    process forked afterwards too). A module that fails to import is left out: the forked process imports it
    itself, and says what fails there."""
    gc.disable()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - left to the forked process (see the docstring)
            continue
    gc.freeze()
    gc.enable()
