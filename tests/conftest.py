"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_pool import DistPool  # noqa: E402 - the tests folder is put on the path just above

# Enough ranks for every layout the multi-rank tests use (two modules of up to dp 4 + 2, or tp/pp 2).
GLOO_WORLD = 6
_shared: dict[str, DistPool] = {}


@pytest.fixture
def gloo_pool() -> DistPool:
    """One pool of real Gloo ranks for the whole test run: starting torch processes is slow here. A scenario
    that needs fewer ranks leaves the rest idle. A pool that died (a timed-out scenario closes it) is
    replaced, so one failure does not fail every test after it."""
    pool = _shared.get("pool")
    if pool is None or not pool.alive:
        pool = _shared["pool"] = DistPool(GLOO_WORLD)
    return pool


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    pool = _shared.pop("pool", None)
    if pool is not None:
        pool.close()
