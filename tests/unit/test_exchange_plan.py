"""Exchange plan: simulate every rank's plan in pure Python and check the exchange they imply."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.exchange.plan import (
    ExchangePlan,
    destinations,
    local_flat_indices,
    owner_of,
    permute_local,
    plan_exchange,
    slot_owner,
    validate_assignment,
)

FAST = settings(max_examples=150, deadline=None)


@st.composite
def layouts(draw, max_dp=4):
    d = draw(st.integers(1, max_dp))
    g = d * draw(st.integers(1, 3))
    b = g * draw(st.integers(1, 3))
    w = draw(st.integers(1, 3))
    across = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return d, g, b, w, random_assignment(random.Random(seed), g, b, w, across)


def random_assignment(rng: random.Random, g: int, b: int, w: int, across: bool) -> list[list[list[int]]]:
    per_slot = b // g
    if across:
        pool = list(range(w * b))
        rng.shuffle(pool)
        rows = [pool[m * b : (m + 1) * b] for m in range(w)]
    else:
        rows = []
        for m in range(w):
            row = list(range(m * b, (m + 1) * b))
            rng.shuffle(row)
            rows.append(row)
    return [[row[s * per_slot : (s + 1) * per_slot] for s in range(g)] for row in rows]


def simulate(assignment, d, g, b, sizes):
    """Run the exchange every plan describes, with byte-exact split bookkeeping; return per-rank outputs."""
    w = len(assignment)
    plans = [plan_exchange(assignment, r, d, g, b) for r in range(d)]
    held = {r: {i: ("sample", i) for i in local_flat_indices(r, d, b, w)} for r in range(d)}
    # What goes on the wire: each rank's send buffer is its chunks for ranks 0..d-1 concatenated.
    wire = {r: [[held[r][i] for i in chunk] for chunk in plans[r].send_indices] for r in range(d)}
    outputs = []
    for r, plan in enumerate(plans):
        incoming = [item for src in range(d) for item in wire[src][r]]
        received = dict(zip(plan.recv_order(), incoming, strict=True))
        assert set(received).isdisjoint(plan.keep_indices)
        have = {i: held[r][i] for i in plan.keep_indices}
        have.update(received)
        outputs.append(permute_local(have, plan))
    return plans, outputs


@FAST
@given(layouts(), st.integers(0, 2**32 - 1))
def test_simulated_exchange_delivers_every_rank_its_slots(layout, size_seed):
    d, g, b, w, assignment = layout
    rng = random.Random(size_seed)
    sizes = [16 * rng.randint(1, 50) for _ in range(w * b)]
    plans, outputs = simulate(assignment, d, g, b, sizes)
    k = g // d

    sent_by: dict[int, int] = {}
    for r, plan in enumerate(plans):
        assert plan.send_indices[r] == [] and plan.recv_indices[r] == []
        assert len(plan.send_indices) == len(plan.recv_indices) == d
        local = local_flat_indices(r, d, b, w)
        assert all(owner_of(i, b, d) == r for i in local)
        outgoing = [i for chunk in plan.send_indices for i in chunk]
        # Kept and sent partition what the rank held.
        assert sorted(outgoing + plan.keep_indices) == local
        assert plan.keep_indices == sorted(plan.keep_indices)
        for s in range(d):
            assert plan.send_indices[s] == sorted(plan.send_indices[s])
            assert plan.recv_indices[s] == sorted(plan.recv_indices[s])
            # What r sends to s is exactly, in the same order, what s expects from r.
            assert plan.send_indices[s] == plans[s].recv_indices[r]
            assert plan.send_split_bytes(sizes)[s] == plans[s].recv_split_bytes(sizes)[r]
            assert plan.send_split_bytes(sizes)[s] == sum(sizes[i] for i in plan.send_indices[s])
        for i in outgoing:
            assert i not in sent_by, f"sample {i} sent twice"
            sent_by[i] = r
        assert plan.recv_sizes(sizes) == [sizes[i] for i in plan.recv_order()]
        assert sum(plan.recv_split_bytes(sizes)) == sum(plan.recv_sizes(sizes))

    # Every sample that changes rank is sent exactly once, by its owner; none other is sent.
    movers = {}
    for m in range(w):
        for slot in range(g):
            for i in assignment[m][slot]:
                if owner_of(i, b, d) != slot * d // g:
                    movers[i] = owner_of(i, b, d)
    assert sent_by == movers
    assert all(p.any_moves == bool(movers) for p in plans)

    # Each rank outputs its own slots, concatenated in order; together the ranks output the whole window.
    seen = []
    for r in range(d):
        mine = [s for s in range(g) if s * d // g == r]
        assert len(mine) == k
        for m in range(w):
            expected = [i for s in mine for i in assignment[m][s]]
            assert outputs[r][m] == [("sample", i) for i in expected]
            assert plans[r].output_order[m] == expected
            seen.extend(expected)
    assert sorted(seen) == list(range(w * b))


@FAST
@given(layouts(max_dp=1))
def test_dp1_keeps_everything_and_permutes_locally(layout):
    d, g, b, w, assignment = layout
    assert d == 1
    plan = plan_exchange(assignment, 0, 1, g, b)
    assert plan.send_indices == [[]] and plan.recv_indices == [[]]
    assert plan.keep_indices == list(range(w * b))
    assert plan.any_moves is False
    assert plan.send_split_bytes([1] * (w * b)) == [0] == plan.recv_split_bytes([1] * (w * b))
    window = [f"s{i}" for i in range(w * b)]  # local position == flat index when d == 1
    out = permute_local(window, plan)
    assert out == [[f"s{i}" for slot in assignment[m] for i in slot] for m in range(w)]


def test_worked_example_two_ranks_two_microbatches():
    # B=4, G=2, d=2: rank 0 holds 0,1 | 4,5 and owns slot 0; rank 1 holds 2,3 | 6,7 and owns slot 1.
    assignment = [[[3, 0], [1, 2]], [[5, 7], [4, 6]]]
    p0 = plan_exchange(assignment, 0, 2, 2, 4)
    p1 = plan_exchange(assignment, 1, 2, 2, 4)
    assert p0.keep_indices == [0, 5] and p1.keep_indices == [2, 6]
    assert p0.send_indices == [[], [1, 4]] and p1.recv_indices == [[1, 4], []]
    assert p1.send_indices == [[3, 7], []] and p0.recv_indices == [[], [3, 7]]
    assert p0.output_order == [[3, 0], [5, 7]] and p1.output_order == [[1, 2], [4, 6]]
    sizes = {0: 16, 1: 32, 2: 48, 3: 64, 4: 80, 5: 96, 6: 112, 7: 128}
    assert p0.send_split_bytes(sizes) == [0, 32 + 80] == p1.recv_split_bytes(sizes)[::-1]
    assert p0.recv_split_bytes(sizes) == [0, 64 + 128]


def test_heterogeneous_fan_out_slot_ownership():
    # G = lcm(2, 4) = 4: encoder replica i feeds language replicas 2i, 2i+1 (contiguous bridge fan-out).
    assert [slot_owner(s, 4, 2) for s in range(4)] == [0, 0, 1, 1]
    assert [slot_owner(s, 4, 4) for s in range(4)] == [0, 1, 2, 3]
    assert [owner_of(i, 8, 2) for i in range(16)] == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4
    assert local_flat_indices(1, 2, 8, 2) == [4, 5, 6, 7, 12, 13, 14, 15]
    assignment = [[[7, 0], [1, 6], [2, 5], [3, 4]]]
    assert destinations(assignment, 4, 2) == [0, 0, 1, 1, 1, 1, 0, 0]
    assert destinations(assignment, 4, 4) == [0, 1, 2, 3, 3, 2, 1, 0]


def test_across_microbatch_window_moves_samples_between_microbatches():
    assignment = [[[4, 5], [2, 3]], [[0, 1], [6, 7]]]  # micro-batch 0's first slot took micro-batch 1's samples
    plans, outputs = simulate(assignment, 2, 2, 4, [16] * 8)
    assert outputs[0] == [[("sample", 4), ("sample", 5)], [("sample", 0), ("sample", 1)]]
    assert plans[0].any_moves is False  # rank 0 holds 0,1,4,5 and keeps all of them


# ---------------------------------------------------------------------------------------------------
# Validation


GOOD = [[[3, 0], [1, 2]], [[5, 7], [4, 6]]]


@pytest.mark.parametrize(
    "assignment, words",
    [
        ([], "empty"),
        ([[[3, 0], [1, 2]], [[5, 7], [4, 4]]], "index 4 twice"),
        ([[[3, 0], [1, 2]], [[5, 7], [4, 8]]], "index 8 outside the window [0, 8)"),
        ([[[3, 0], [1, 2]], [[5, 7], [4, -1]]], "index -1 outside"),
        ([[[3, 0, 1], [2]], [[5, 7], [4, 6]]], "micro-batch 0 slot 0 has 3 samples, expected 2"),
        ([[[3, 0], [1, 2], []], [[5, 7], [4, 6]]], "micro-batch 0 has 3 slots"),
        ([[[3, 0], [1, 2]], [[5, 7], [4, 6.0]]], "not an int"),
        ([[[3, 0], [1, 2]], [[5, 7], [4, True]]], "not an int"),
    ],
)
def test_bad_assignments_are_refused(assignment, words):
    with pytest.raises(ValueError) as info:
        plan_exchange(assignment, 0, 2, 2, 4)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "args, words",
    [
        ((GOOD, 0, 2, 3, 6), "num_slots 3 is not a multiple of dp_size 2"),
        ((GOOD, 0, 2, 2, 5), "microbatch_size 5 is not a multiple of num_slots 2"),
        ((GOOD, 2, 2, 2, 4), "dp_rank must be in [0, 2)"),
        ((GOOD, 0, 0, 2, 4), "dp_size must be a positive int"),
        ((GOOD, 0, 2, 2, 0), "microbatch_size must be a positive int"),
    ],
)
def test_bad_layouts_are_refused(args, words):
    with pytest.raises(ValueError) as info:
        plan_exchange(*args)
    assert words in str(info.value)


def test_num_microbatches_is_checked():
    assert plan_exchange(GOOD, 0, 2, 2, 4, num_microbatches=2).num_microbatches == 2
    with pytest.raises(ValueError, match="expected num_microbatches 3"):
        plan_exchange(GOOD, 0, 2, 2, 4, num_microbatches=3)


@FAST
@given(layouts(), st.data())
def test_any_broken_permutation_is_refused(layout, data):
    d, g, b, w, assignment = layout
    assert validate_assignment(assignment, g, b) == w
    flat = [(m, s, j) for m in range(w) for s in range(g) for j in range(b // g)]
    m, s, j = data.draw(st.sampled_from(flat))
    broken = [[list(slot) for slot in slots] for slots in assignment]
    old = broken[m][s][j]
    new = data.draw(st.integers(-3, w * b + 3).filter(lambda v: v != old))
    broken[m][s][j] = new  # a duplicate, or a value outside the window
    with pytest.raises(ValueError):
        plan_exchange(broken, 0, d, g, b)


def test_permute_local_names_missing_samples():
    plan = plan_exchange(GOOD, 0, 2, 2, 4)
    with pytest.raises(KeyError, match=r"needs window samples \[3\]"):
        permute_local({0: "a", 5: "b", 7: "c"}, plan)


def test_plan_is_frozen():
    plan = plan_exchange(GOOD, 0, 2, 2, 4)
    assert isinstance(plan, ExchangePlan)
    with pytest.raises(AttributeError):
        plan.keep_indices = []  # type: ignore[misc]
