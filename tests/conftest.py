"""Fixtures and tiers shared by the test modules.

Tests live in folders by tier: ``unit/`` (pure logic and single-process nodes), ``distributed/`` (multi-rank scenarios
in the warm Gloo pool), ``launch/`` (real launches), with their helpers in ``helpers/``. Every test under
``distributed/`` or using the ``gloo_pool`` fixture is marked ``dist``, every test under ``launch/`` ``launch``, so
``pytest -m "not dist and not launch"`` is the unit run. A few tests beside their module's fixtures in
``unit/`` or ``distributed/`` start real processes (fresh interpreters, worker processes, spawned ranks): they carry
the ``launch`` mark themselves.
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline for the properties: a deadline is a timing assertion, and on a shared or loaded machine
# (two test processes on two cores, a first call that imports a module) an example that takes 200 ms once and
# 0.2 ms when hypothesis replays it fails as "flaky". The properties that set their own settings already say
# deadline=None; this covers the ones that keep hypothesis's defaults.
settings.register_profile("mimo-pipes", deadline=None)
settings.load_profile("mimo-pipes")

# One intra-op thread per test process, as every rank of a job runs (the launcher sets the same): the units'
# tensors are tiny, and two threads a process under `-n 2` on two cores spent most of their CPU time spinning at
# barriers (the packed-attention tests: 5.9 s of CPU with two, 0.2 s with one). Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Collecting imports torch, transformers and every test module: some 400,000 long-lived objects that each full pass
# of the garbage collector would scan again. Paused until collection ends, then they are frozen out of its scans.
gc.disable()

_HERE = os.path.dirname(os.path.abspath(__file__))
# Helpers and the modules of every tier import each other by name (a scenario's function is found by module).
sys.path[:0] = [os.path.join(_HERE, tier) for tier in ("helpers", "unit", "distributed", "launch")]

from dist_pool import DistPool, close_shared_pool, shared_pool  # noqa: E402 - the folders are put on the path just above


@pytest.fixture
def gloo_pool() -> DistPool:
    """One pool of real Gloo ranks for the whole test run (see :func:`dist_pool.shared_pool`)."""
    return shared_pool()


# The folders whose every test carries a tier's mark (see pytest_collection_modifyitems).
_TIER_FOLDERS = {"distributed": "dist", "launch": "launch"}
_MARK_NAME = re.compile(r"[\w:+\-.\[\]\\/]+")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A tier's folder that the ``-m`` expression selects no test of is not imported at all: ``-m "not dist and
    not launch"`` would deselect every test of distributed/ and launch/ after importing their modules (megatron,
    s3fs, moto, transformers' models: about 1.2 CPU-s a process)."""
    tier = _TIER_FOLDERS.get(collection_path.name)
    if tier is None or str(collection_path.parent) != _HERE:
        return None
    return True if _never_selected(config.option.markexpr, tier) else None


def _never_selected(markexpr: str, mark: str) -> bool:
    """Whether ``markexpr`` is false for every test carrying ``mark``, whatever other marks it has: tried with
    each of the names it mentions present and absent (an expression with mark arguments is never judged)."""
    if not markexpr or "(" in markexpr:
        return False
    try:  # pytest's own parser of -m (private: where it differs, every folder is collected as before)
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
    except Exception:  # noqa: BLE001
        return False
    names = sorted(set(_MARK_NAME.findall(markexpr)) - {"and", "or", "not", mark})
    if len(names) > 10:
        return False
    for present in itertools.product((False, True), repeat=len(names)):
        marks = {mark, *(name for name, on in zip(names, present) if on)}
        try:
            if expression.evaluate(lambda name, /, marks=marks, **kwargs: name in marks):
                return False
        except Exception:  # noqa: BLE001 - see above
            return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = os.path.basename(os.path.dirname(str(item.fspath)))
        if tier == "launch":
            item.add_marker(pytest.mark.launch)
        elif tier == "distributed" or "gloo_pool" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.dist)
        if _uses_the_pool(item) and item.get_closest_marker("launch") is not None:
            # Launches that also run jobs in the pool share one worker under `-n 2 --dist loadgroup`, so only one
            # pool of GLOO_WORLD ranks is started for the launch tier (each start imports torch in every rank).
            item.add_marker(pytest.mark.xdist_group("gloo-pool"))


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.freeze()
    gc.enable()


def _uses_the_pool(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return "gloo_pool" in getattr(item, "fixturenames", ()) or getattr(module, "shared_pool", None) is shared_pool


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    close_shared_pool()
