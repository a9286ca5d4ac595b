"""Fixtures shared by the test modules."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_pool import DistPool, close_shared_pool, shared_pool  # noqa: E402 - the tests folder is put on the path just above


@pytest.fixture
def gloo_pool() -> DistPool:
    """One pool of real Gloo ranks for the whole test run (see :func:`dist_pool.shared_pool`)."""
    return shared_pool()


WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shard_weights.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th of N shards (1-based) of the test modules, balanced by the seconds in "
                          "tests/shard_weights.json: two shards run side by side keep both cores busy")


def shard_modules(modules: list[str], shards: int, seconds: dict[str, float]) -> list[list[str]]:
    """Whole modules (their fixtures stay in one process) dealt heaviest first to the lightest shard; a
    module missing from the table counts 2 s. The same modules give the same shards in every process."""
    loads = [0.0] * shards
    dealt: list[list[str]] = [[] for _ in range(shards)]
    for module in sorted(modules, key=lambda m: (-seconds.get(m, 2.0), m)):
        lightest = min(range(shards), key=lambda s: (loads[s], s))
        dealt[lightest].append(module)
        loads[lightest] += seconds.get(module, 2.0)
    return dealt


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        k, n = (int(part) for part in spec.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard: {spec!r} is not K/N with 1 <= K <= N") from None
    with open(WEIGHTS) as handle:
        seconds = json.load(handle)
    modules = sorted({item.nodeid.split("::")[0] for item in items})
    mine = set(shard_modules(modules, n, seconds)[k - 1])
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid.split("::")[0] not in mine])
    items[:] = [item for item in items if item.nodeid.split("::")[0] in mine]


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    close_shared_pool()
    # MIMO_TEST_SECONDS=tests/shard_weights.json refreshes the shards' weights from this run's modules.
    path = os.environ.get("MIMO_TEST_SECONDS")
    if path and _module_seconds:
        known = {}
        if os.path.exists(path):
            with open(path) as handle:
                known = json.load(handle)
        known.update({module: round(seconds, 1) for module, seconds in _module_seconds.items()})
        with open(path, "w") as handle:
            json.dump(dict(sorted(known.items())), handle, indent=0)
            handle.write("\n")
