"""The faster searches return exactly what their plain references do (``balance_references``): the same plan, the
same path, the same work counted and the same budget stops, on windows of repeated costs and long tails alike. A
plan must be the same on every rank and in every version, so a rewrite for speed may not change one index."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from balance_references import reference_repair, reference_search_slots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.balance.quality import sorted_lower_bound
from mimo_pipes.balance.search.exact import search_slots
from mimo_pipes.balance.window.level_repair import Passed, repair, sorted_path
from mimo_pipes.balance.window.tuning import TUNING

RESOLUTIONS = (0, 64, 144, 256, 391, 576, 1024, 1296, 4096)


def _costs(rng: np.random.Generator, size: int) -> np.ndarray:
    """Repeated costs (a few resolutions and text-only zeros) or a long tail, at random."""
    if rng.random() < 0.6:
        return rng.choice(rng.choice(RESOLUTIONS, size=int(rng.integers(1, 5))), size=size).astype(np.int64)
    return (rng.pareto(1.2, size) * 300).astype(np.int64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(2, 8), st.integers(2, 16), st.integers(1, 3), st.integers(0, 2**32 - 1),
    st.sampled_from([(7, 5_000_000), (0, 5_000_000), (3, 4_000)]),
)
def test_the_repair_is_the_reference_repair(count, num_slots, per_slot, seed, tabu_and_work):
    """From a random plan toward caps some plans meet and some do not (its loads scaled down by up to 40%), with
    and without a floor, a tabu and a work budget that stops it early."""
    rng = np.random.default_rng(seed)
    flat = _costs(rng, count * num_slots * per_slot)
    floor = int(rng.choice([0, flat.sum() // (count * num_slots) // 2]))
    members = rng.permutation(flat.shape[0]).astype(np.int64).reshape(-1, per_slot)
    loads = np.sort(flat[members].sum(axis=1))[::-1]
    caps = np.sort((loads * rng.uniform(0.6, 1.0) + rng.integers(0, 50, loads.shape[0])).astype(np.int64))[::-1].copy()
    tuning = replace(TUNING, levels_tabu=tabu_and_work[0], levels_work=tabu_and_work[1])
    start = sorted_path(loads, num_slots, floor) if rng.random() < 0.5 else 10**12
    ours, reference = Passed(start, members), Passed(start, members)
    reached = repair(flat, members, caps, num_slots, floor, ours, tuning)
    expected = reference_repair(flat, members, caps, num_slots, floor, reference, tuning)
    assert (reached is None) == (expected is None)
    if expected is not None:
        assert np.array_equal(reached, expected)
    assert (ours.path, ours.work) == (reference.path, reference.work)
    assert np.array_equal(ours.members, reference.members)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 8), st.integers(1, 8), st.integers(0, 2**32 - 1), st.sampled_from([50, 500, 20_000]),
    st.sampled_from([None, 0, 300, 2000]),
)
def test_the_exact_search_is_the_reference_search(num_slots, per_slot, seed, node_limit, above):
    """From no incumbent or one above the mean slot load, with budgets that stop it and one that lets it finish."""
    rng = np.random.default_rng(seed)
    ordered = np.sort(_costs(rng, num_slots * per_slot))[::-1]
    costs = ordered.tolist()
    incumbent = None if above is None else sum(costs) // num_slots + above
    lower = sorted_lower_bound(ordered, num_slots)
    expected = reference_search_slots(list(costs), num_slots, incumbent, lower, node_limit)
    assert search_slots(list(costs), num_slots, incumbent, lower, node_limit) == expected
