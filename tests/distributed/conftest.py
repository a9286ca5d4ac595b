"""The multi-rank tier's rank server imports what the selected scenarios import in every rank.

A test module names them in ``POOL_PRELOAD`` (megatron-core for the routing scenarios: some 10 CPU-s over six ranks);
every job opens the embedded data through ``datasets``. Each is imported once by the rank server that forks every
pool rank, instead of by each rank on its first scenario. Only the selected tests of this folder that launch nothing
count, so a run of the launch tier imports nothing more.
"""

from __future__ import annotations

import pytest
from dist_pool import preload

EVERY_JOB = ("datasets",)


def pytest_collection_finish(session: pytest.Session) -> None:
    pooled = [item for item in session.items if "distributed" in item.nodeid.split("/") and item.get_closest_marker("launch") is None]
    if pooled:
        preload(EVERY_JOB)
    for item in pooled:
        preload(getattr(getattr(item, "module", None), "POOL_PRELOAD", ()))
