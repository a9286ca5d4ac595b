"""Properties of the balancing engine: partitions, determinism, optimality on small inputs, windows."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import (
    balance_microbatch,
    balance_window,
    contiguous_assignment,
    critical_path,
    exact_assignment,
    karmarkar_karp_assignment,
    lower_bound,
    lpt_assignment,
    max_load,
    objective,
    ratio_to_bound,
    slot_loads,
    spread,
    window_lower_bound,
)

SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- strategies


@st.composite
def microbatches(draw, max_slots: int = 8, max_per_slot: int = 6):
    """(costs, G): VLM-like costs, many ties and zeros, sometimes a heavy outlier."""
    num_slots = draw(st.integers(1, max_slots))
    per_slot = draw(st.integers(1, max_per_slot))
    size = num_slots * per_slot
    style = draw(st.sampled_from(["pool", "wide", "outliers"]))
    if style == "pool":
        pool = draw(st.lists(st.integers(0, 2000), min_size=1, max_size=4))
        costs = draw(st.lists(st.sampled_from(pool), min_size=size, max_size=size))
    elif style == "wide":
        costs = draw(st.lists(st.integers(0, 5000), min_size=size, max_size=size))
    else:
        costs = draw(st.lists(st.integers(0, 300), min_size=size, max_size=size))
        heavy = draw(st.lists(st.integers(0, size - 1), max_size=3))
        for i in heavy:
            costs[i] += 10_000
    return costs, num_slots


@st.composite
def windows(draw):
    count = draw(st.integers(1, 5))
    costs, num_slots = draw(microbatches(max_slots=6, max_per_slot=4))
    size = len(costs)
    rows = [costs] + [
        draw(st.lists(st.integers(0, 4000), min_size=size, max_size=size)) for _ in range(count - 1)
    ]
    return rows, num_slots


def assert_partition(slots, size: int, num_slots: int) -> None:
    assert len(slots) == num_slots
    per_slot = size // num_slots
    assert all(len(slot) == per_slot for slot in slots)
    flat = [i for slot in slots for i in slot]
    assert sorted(flat) == list(range(size))
    assert all(slot == sorted(slot) for slot in slots), "indices within a slot must ascend"
    firsts = [slot[0] for slot in slots if slot]
    assert firsts == sorted(firsts), "slots must be ordered by their smallest index"


def brute_force(costs, num_slots):
    """Lexicographically smallest (heaviest, spread) over every equal-count partition."""
    size = len(costs)
    per_slot = size // num_slots
    best = None

    def rec(remaining, loads):
        nonlocal best
        if not remaining:
            key = (max(loads), max(loads) - min(loads))
            best = key if best is None or key < best else best
            return
        first, rest = remaining[0], remaining[1:]
        for others in itertools.combinations(rest, per_slot - 1):
            group = (first,) + others
            left = tuple(i for i in rest if i not in others)
            rec(left, loads + [sum(costs[i] for i in group)])

    rec(tuple(range(size)), [])
    return best


# ---------------------------------------------------------------- micro-batch properties


@SETTINGS
@given(microbatches())
def test_equal_count_partition_in_canonical_order(case):
    costs, num_slots = case
    for planner in (balance_microbatch, lpt_assignment, karmarkar_karp_assignment,
                    contiguous_assignment):
        assert_partition(planner(costs, num_slots), len(costs), num_slots)


@SETTINGS
@given(microbatches())
def test_deterministic_and_independent_of_input_container(case):
    costs, num_slots = case
    first = balance_microbatch(costs, num_slots)
    assert balance_microbatch(list(costs), num_slots) == first
    assert balance_microbatch(tuple(costs), num_slots) == first
    assert balance_microbatch(np.asarray(costs, dtype=np.int32), num_slots) == first
    assert balance_microbatch([np.uint16(c) if c < 2**16 else c for c in costs], num_slots) == first


@SETTINGS
@given(microbatches(), st.randoms(use_true_random=False))
def test_permuting_equal_cost_samples_keeps_the_loads(case, rng):
    costs, num_slots = case
    loads = sorted(slot_loads(costs, balance_microbatch(costs, num_slots)))
    # Exchange the labels of samples of equal cost: the loads must not change.
    relabel = list(range(len(costs)))
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(costs):
        groups.setdefault(c, []).append(i)
    for group in groups.values():
        shuffled = group[:]
        rng.shuffle(shuffled)
        for src, dst in zip(group, shuffled):
            relabel[src] = dst
    permuted = [0] * len(costs)
    for src, dst in enumerate(relabel):
        permuted[dst] = costs[src]
    assert sorted(slot_loads(permuted, balance_microbatch(permuted, num_slots))) == loads


@SETTINGS
@given(microbatches(), st.randoms(use_true_random=False))
def test_any_permutation_keeps_the_quality(case, rng):
    costs, num_slots = case
    order = list(range(len(costs)))
    rng.shuffle(order)
    permuted = [costs[i] for i in order]
    ours_slots = balance_microbatch(costs, num_slots)
    theirs_slots = balance_microbatch(permuted, num_slots)
    # The engine only sees sorted costs, so the quality cannot depend on the order of the samples,
    # except where the split as it stands wins (or ties) and is returned instead.
    stays = contiguous_assignment(costs, num_slots)
    if ours_slots != stays and theirs_slots != stays:
        assert objective(permuted, theirs_slots) == objective(costs, ours_slots)
        assert sorted(slot_loads(permuted, theirs_slots)) == sorted(slot_loads(costs, ours_slots))


def test_balanced_input_stays_where_it_is():
    assert balance_microbatch([0, 0, 0, 0], 2) == [[0, 1], [2, 3]]
    assert balance_microbatch([1, 2, 2, 1], 2) == [[0, 1], [2, 3]]
    assert objective([5, 5, 1, 1], balance_microbatch([5, 5, 1, 1], 2)) == (6, 0)
    rows = [[3, 3, 3, 3], [0, 7, 7, 0]]
    assert balance_window(rows, 2, across_microbatches=True) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


@SETTINGS
@given(microbatches(max_slots=16, max_per_slot=8))
def test_never_worse_than_lpt_and_never_below_the_bound(case):
    costs, num_slots = case
    ours = objective(costs, balance_microbatch(costs, num_slots))
    anchor = objective(costs, lpt_assignment(costs, num_slots))
    assert ours <= anchor
    assert lower_bound(costs, num_slots) <= ours[0]


def test_bound_beats_lpt_on_a_known_case():
    # LPT puts 5+4 against 3+3+... : a small case where greedy is strictly worse than optimal.
    costs = [5, 4, 3, 3, 3, 0]
    anchor = objective(costs, lpt_assignment(costs, 2))
    ours = objective(costs, balance_microbatch(costs, 2))
    assert ours == (9, 0)
    assert anchor > ours


def test_matches_brute_force_on_small_instances():
    rng = random.Random(1234)
    exact_max = exact_both = total = 0
    worst = 0.0
    for _ in range(150):
        num_slots = rng.choice([2, 3, 4])
        per_slot = rng.choice([2, 3]) if num_slots < 4 else 2
        style = rng.random()
        costs = [
            rng.choice([0, 64, 256, 1024, 4096]) if style < 0.3 else rng.randint(0, 3000)
            for _ in range(num_slots * per_slot)
        ]
        best = brute_force(costs, num_slots)
        ours = objective(costs, balance_microbatch(costs, num_slots))
        assert lower_bound(costs, num_slots) <= best[0]
        total += 1
        exact_max += ours[0] == best[0]
        exact_both += ours == best
        if best[0]:
            worst = max(worst, ours[0] / best[0] - 1)
    print(f"\nheaviest slot optimal in {exact_max}/{total}, (heaviest, spread) in {exact_both}/{total}, "
          f"worst {100 * worst:.3f}% above")
    assert worst <= 0.01
    assert exact_max == total  # small inputs go through the exact search
    assert exact_both >= 0.9 * total


def test_exact_assignment_proves_small_optimum():
    costs = [7, 7, 6, 5, 5, 4, 3, 1]
    slots, proven = exact_assignment(costs, 2)
    assert proven
    assert_partition(slots, len(costs), 2)
    assert max_load(costs, slots) == brute_force(costs, 2)[0] == 19


def test_trivial_shapes():
    assert balance_microbatch([3, 1, 2], 1) == [[0, 1, 2]]
    assert balance_microbatch([3, 1, 2], 3) == [[0], [1], [2]]
    assert balance_microbatch([], 4) == [[], [], [], []]
    assert contiguous_assignment([1, 2, 3, 4, 5, 6], 3) == [[0, 1], [2, 3], [4, 5]]


def test_quality_figures():
    costs = [4, 1, 3, 2]
    slots = [[0, 1], [2, 3]]
    assert slot_loads(costs, slots) == [5, 5]
    assert spread(costs, [[0, 2], [1, 3]]) == 4
    assert objective(costs, [[0, 2], [1, 3]]) == (7, 4)
    assert lower_bound(costs, 2) == 5
    assert ratio_to_bound(11, 10) == pytest.approx(1.1)
    assert ratio_to_bound(0, 0) == 1.0


def test_large_inputs_stay_exact_and_balanced():
    rng = random.Random(7)
    costs = [rng.choice([0, rng.randint(64, 4096), 2**40 + rng.randint(0, 99)]) for _ in range(512)]
    slots = balance_microbatch(costs, 64)
    assert_partition(slots, 512, 64)
    assert objective(costs, slots) <= objective(costs, lpt_assignment(costs, 64))


# Half text-only samples (cost 0) and half photos, 160 samples over 32 slots: drawn by the balancing
# benchmark (benchmarks/balance.py, text+photos mix, G = 32, B/G = 5, first of its four micro-batches).
# The exhaustive three-slot search of the benchmark finds a heaviest slot of 1270; the lower bound is
# 1264. The engine used to stop at 1283 (1.02% above 1270).
TEXT_AND_PHOTOS_160 = [
    333, 0, 792, 625, 540, 672, 465, 468, 0, 512, 0, 0, 0, 0, 0, 420, 868, 1015, 350, 240,
    0, 0, 0, 0, 270, 600, 416, 0, 0, 792, 0, 272, 900, 990, 0, 350, 0, 0, 0, 336,
    0, 805, 550, 0, 0, 170, 696, 0, 0, 0, 0, 462, 380, 0, 0, 0, 0, 0, 308, 437,
    0, 300, 195, 171, 374, 306, 576, 450, 495, 0, 304, 384, 476, 0, 945, 0, 0, 0, 0, 864,
    0, 1088, 308, 0, 0, 0, 0, 578, 216, 0, 630, 0, 1188, 0, 0, 168, 0, 0, 0, 666,
    0, 154, 216, 336, 775, 238, 325, 442, 0, 210, 0, 0, 0, 330, 204, 754, 560, 340, 0, 0,
    99, 816, 667, 396, 364, 336, 0, 0, 0, 0, 0, 0, 360, 529, 726, 0, 204, 558, 0, 0,
    290, 306, 300, 442, 0, 276, 0, 0, 0, 1089, 348, 0, 0, 0, 0, 0, 0, 297, 418, 0,
]


def test_zero_heavy_mix_within_one_percent_of_the_best_known():
    costs = TEXT_AND_PHOTOS_160
    slots = balance_microbatch(costs, 32)
    assert_partition(slots, 160, 32)
    bound = lower_bound(costs, 32)
    assert bound == 1264
    heaviest = max_load(costs, slots)
    # Within 1% of the proven bound, hence of the optimum, and of the best assignment known (1270).
    assert 100 * heaviest <= 101 * bound
    assert 100 * heaviest <= 101 * 1270
    assert objective(costs, slots) <= objective(costs, lpt_assignment(costs, 32))


@pytest.mark.parametrize(
    "costs, num_slots, fragment",
    [
        ([1, 2, 3], 2, "not divisible"),
        ([1, -2], 1, "costs[1] must be >= 0"),
        ([1, 2.0], 1, "costs[1] must be an integer"),
        ([True, 1], 2, "costs[0] must be an integer"),
        ([1, "2"], 2, "costs[1] must be an integer"),
        ([1, 2], 0, "num_slots"),
        ([1, 2], True, "num_slots"),
        ([1, 2], 2.0, "num_slots"),
        (np.array([1, -2]), 1, "costs[1] must be >= 0"),
        (np.array([True, False]), 1, "costs[0] must be an integer"),
        ("12", 1, "sequence"),
        ([2**62, 2**62], 1, "too large"),
    ],
)
def test_invalid_microbatch(costs, num_slots, fragment):
    with pytest.raises(ValueError) as info:
        balance_microbatch(costs, num_slots)
    assert fragment in str(info.value)


# ---------------------------------------------------------------- windows


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])  # whole windows: ~40 ms an example
@given(windows(), st.booleans())
def test_window_conserves_samples_and_shapes(case, across):
    rows, num_slots = case
    count, size = len(rows), len(rows[0])
    plan = balance_window(rows, num_slots, across_microbatches=across)
    assert len(plan) == count
    seen = []
    for m, slots in enumerate(plan):
        assert len(slots) == num_slots
        assert all(len(slot) == size // num_slots for slot in slots)
        assert all(slot == sorted(slot) for slot in slots)
        flat = [i for slot in slots for i in slot]
        if not across:
            assert sorted(flat) == list(range(m * size, (m + 1) * size))
        seen += flat
    assert sorted(seen) == list(range(count * size))
    path = critical_path(rows, plan)
    assert window_lower_bound(rows, num_slots, across_microbatches=across) <= path
    if across:
        assert path <= sum(max_load(row, lpt_assignment(row, num_slots)) for row in rows)
    else:
        assert path == sum(max_load(row, balance_microbatch(row, num_slots)) for row in rows)
        assert critical_path(rows, balance_window(rows, num_slots)) == path  # the default is per micro-batch


def test_window_across_beats_per_microbatch_on_mixed_costs():
    rng = random.Random(3)
    rows = [[rng.choice([0, 0, 64, 256, 1024, 3000, 9000]) for _ in range(16)] for _ in range(8)]
    independent = critical_path(rows, balance_window(rows, 8))
    across = critical_path(rows, balance_window(rows, 8, across_microbatches=True))
    bound = window_lower_bound(rows, 8)
    assert across < independent
    assert across <= 1.10 * bound


def test_window_one_sample_per_slot_is_optimal():
    rows = [[9, 1, 1, 1], [8, 2, 2, 2], [7, 3, 3, 3]]
    plan = balance_window(rows, 4, across_microbatches=True)
    assert critical_path(rows, plan) == 9 + 3 + 2 == window_lower_bound(rows, 4)


@pytest.mark.parametrize(
    "rows, num_slots, fragment",
    [
        ([], 2, "at least one micro-batch"),
        ([[1, 2], [3]], 1, "same size"),
        ([[1, 2], [3, -4]], 1, "costs[1][1] must be >= 0"),
        ([[1, 2, 3]], 2, "not divisible"),
        ([[1, 2], 5], 1, "costs[1] must be a sequence"),
    ],
)
def test_invalid_window(rows, num_slots, fragment):
    with pytest.raises(ValueError) as info:
        balance_window(rows, num_slots, across_microbatches=True)
    assert fragment in str(info.value)


# ---------------------------------------------------------------- determinism across processes

FIXED = [
    ([5, 1, 3, 3, 2, 0, 7, 7], 4),
    ([0] * 12 + [64] * 4, 4),
    ([random.Random(9).randint(0, 5000) for _ in range(96)], 16),
    ([random.Random(10).choice([0, 64, 1369, 4096, 9000]) for _ in range(512)], 64),
    ([random.Random(11).randint(0, 3000) for _ in range(24)], 4),
]
FIXED_WINDOW = [[random.Random(12 + m).randint(0, 4000) for _ in range(32)] for m in range(8)]
# Small enough for the branch and bound that ends the window planner (which improves on this one).
SMALL_WINDOW = [[988, 99, 920, 300, 572, 928, 210, 228, 414, 960, 272, 121],
                [169, 270, 224, 1296, 1935, 650, 2209, 352, 360, 132, 576, 286]]


def test_same_assignment_in_a_fresh_process():
    script = textwrap.dedent(
        """
        import json, sys
        from mimo_pipes.balance import balance_microbatch, balance_window
        cases, window, small = json.load(sys.stdin)
        out = [balance_microbatch(c, g) for c, g in cases]
        out.append(balance_window(window, 8, across_microbatches=True))
        out.append(balance_window(small, 4, across_microbatches=True))
        json.dump(out, sys.stdout)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([FIXED, FIXED_WINDOW, SMALL_WINDOW]),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    theirs = json.loads(proc.stdout)
    ours = [balance_microbatch(c, g) for c, g in FIXED]
    ours.append(balance_window(FIXED_WINDOW, 8, across_microbatches=True))
    ours.append(balance_window(SMALL_WINDOW, 4, across_microbatches=True))
    assert theirs == ours
