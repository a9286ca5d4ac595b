"""Data, by concern: ``sources/`` (what ``--dataset`` names, opened as rows), ``processing/`` (a row made into a
module's fields), ``bad_rows/`` (the kinds of bad row, their replacement, their check) and ``embedded/`` (the
built-in dataset and processors, built offline); ``cache.py``, ``paths.py`` and ``from_config.py`` (the data a
``PipelineConfig`` names) serve them all.

Names are imported lazily, so ``import mimo_pipes.data`` stays cheap until one is used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "generate_synthetic_dataset": "embedded.synthetic",
    "KIND_MIX": "embedded.synthetic",
    "build_default_processor": "embedded.builtin_processor",
    "default_processor_path": "embedded.builtin_processor",
    "check_processor_path": "processing.processor",
    "load_processor": "processing.processor",
    "SampleProcessor": "processing.processor",
    "default_dataset_path": "embedded.builtin_dataset",
    "check_dataset_path": "sources.saved_folder",
    "open_dataset": "sources.saved_folder",
    "cache_root": "cache",
    "open_source": "sources.open_source",
    "check_source": "sources.open_source",
    "build_family_processor": "embedded.family_processors",
    "SkipBadRows": "bad_rows.skipping",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
