"""The built-in dataset: the synthetic one (:mod:`~mimo_pipes.data.embedded.synthetic`), generated once per
``(num_samples, seed)`` into the per-user cache and reused by every process."""

from __future__ import annotations

from pathlib import Path

from mimo_pipes.data.cache import build_atomically, cache_root

DATASET_VERSION = "v1"
"""Bumped whenever the synthetic generator changes, so a stale cached copy is never reused."""

DEFAULT_NUM_SAMPLES = 512


def default_dataset_path(num_samples: int = DEFAULT_NUM_SAMPLES, seed: int = 0) -> Path:
    """The cached synthetic dataset for ``(num_samples, seed)``, generated on first use."""
    from mimo_pipes.data.embedded.synthetic import generate_synthetic_dataset

    final = cache_root() / f"dataset-{DATASET_VERSION}-n{int(num_samples)}-s{int(seed)}"
    return build_atomically(final, lambda tmp: generate_synthetic_dataset(tmp, num_samples, seed))
