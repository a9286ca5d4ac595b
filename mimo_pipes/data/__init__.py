"""Data: sources, conversations, processor families, the embedded synthetic dataset and offline processors.

Names are imported lazily, so ``import mimo_pipes.data`` stays cheap until one is used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "generate_synthetic_dataset": "synthetic",
    "KIND_MIX": "synthetic",
    "build_default_processor": "embedded_processor",
    "default_processor_path": "embedded_processor",
    "check_processor_path": "processor",
    "load_processor": "processor",
    "SampleProcessor": "processor",
    "default_dataset_path": "dataset",
    "check_dataset_path": "dataset",
    "open_dataset": "dataset",
    "cache_root": "cache",
    "open_source": "sources",
    "check_source": "sources",
    "build_family_processor": "offline",
    "SkipBadRows": "skipping",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
