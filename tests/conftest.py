"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_pool import DistPool, close_shared_pool, shared_pool  # noqa: E402 - the tests folder is put on the path just above


@pytest.fixture
def gloo_pool() -> DistPool:
    """One pool of real Gloo ranks for the whole test run (see :func:`dist_pool.shared_pool`)."""
    return shared_pool()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    close_shared_pool()
