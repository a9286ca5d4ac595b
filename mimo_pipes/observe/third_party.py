"""Other libraries in a job's process: their noise kept off a job's terminal, on every rank: datasets' progress bars and info lines
while the library opens or saves data ("Generating train split", "Loading dataset from disk", "Saving the
dataset"), transformers' advisory warnings while a processor loads, and torchdata's deprecation warning of
``torch.set_vital`` (raised by every ``StatefulDataLoader``, about torchdata's own call). Their errors stay
visible: only progress bars, info and warnings are held back, and only while the library does its part.
Their import cost too: torch, transformers and datasets build some 400,000 long-lived objects as their modules
load, and each pass of Python's cyclic garbage collector during the loading scans them again; it is paused while
they load (:func:`paused_gc`; measured on a 2-core machine: ``import torch, transformers`` and a processor's
load on 1.2 CPU-s less, of 6 to 7)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

SET_VITAL_WARNING = r"'set_vital' is deprecated"


def quiet_known_warnings() -> None:
    """Filters of warnings about other libraries' code that a user cannot act on (installed on import)."""
    warnings.filterwarnings("ignore", message=SET_VITAL_WARNING, category=UserWarning)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Within: no cyclic garbage collection (objects freed by reference counting still are); the collector as it
    was afterwards."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """Within: no datasets progress bar and only its errors; its settings as they were afterwards."""
    import datasets

    bars_on = not datasets.utils.are_progress_bars_disabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.utils.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars_on:
            datasets.utils.enable_progress_bars()


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Within: transformers logs only its errors (advice on fast processors, unused keys, ...)."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
            warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
            yield
    finally:
        transformers_logging.set_verbosity(verbosity)
