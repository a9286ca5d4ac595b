"""Refinement memory stays linear in the input, and its slot-by-slot search finds exactly the swaps of
the dense tables it replaces for large slots."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_microbatch, balance_window
from mimo_pipes.balance.heuristics import refine

GIB = 1 << 30


@st.composite
def refinement_cases(draw):
    num_slots = draw(st.integers(2, 8))
    per_slot = draw(st.integers(1, 7))
    heavy = draw(st.sampled_from([10, 10**6, 10**12]))
    costs = draw(st.lists(st.one_of(st.just(0), st.just(heavy), st.integers(0, heavy)),
                          min_size=num_slots * per_slot, max_size=num_slots * per_slot))
    members = np.array(draw(st.permutations(range(len(costs))))).reshape(num_slots, per_slot)
    return np.array(sorted(costs), dtype=np.int64), members


@settings(max_examples=120, deadline=None)
@given(refinement_cases())
def test_slot_by_slot_search_matches_the_dense_tables(case):
    sorted_costs, members = case
    dense = refine.refine_members(sorted_costs, members)
    searched = refine.refine_members(sorted_costs, members, dense_elements=0)  # every search slot by slot
    assert np.array_equal(dense, searched)


def test_best_swap_against_brute_force():
    rng = random.Random(7)
    for _ in range(2000):
        give = np.array([rng.randint(-50, 50) for _ in range(rng.randint(0, 6))], dtype=np.int64)
        take = np.array([rng.randint(-50, 50) for _ in range(rng.randint(0, 6))], dtype=np.int64)
        gap = rng.randint(-3, 60)
        best = None
        for i, a in enumerate(give.tolist()):
            for j, b in enumerate(take.tolist()):
                if 0 < a - b < gap and (best is None or min(a - b, gap - a + b) > best[0]):
                    best = (min(a - b, gap - a + b), i, j)
        assert refine._best_swap(give, take, gap) == best


def _peak_rss(stdin: str, command: list[str]) -> tuple[int, int, str, list[str]]:
    """(exit status, peak RSS in bytes, stderr, stdout lines) of ``command`` run on ``stdin``, under a 2 GiB address
    space limit so that a regression fails instead of swamping the machine."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * GIB, 2 * GIB))

    with tempfile.TemporaryFile("w+") as source, tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        source.write(stdin)
        source.seek(0)
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(command, stdin=source, stdout=out, stderr=err, env=env, preexec_fn=limit)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        out.seek(0)
        lines = out.read().splitlines()
        return process.returncode, usage.ru_maxrss * 1024, err.read(), lines


def test_balance_of_10k_samples_over_64_slots_stays_under_1_gib():
    rng = random.Random(1)
    num_slots, size = 64, 10_048
    requests = [
        [rng.choice([0, 10**12, rng.randint(0, 10**12)]) for _ in range(size)],
        [rng.randint(0, 10**12) for _ in range(size)],
    ]
    stdin = "".join(json.dumps({"costs": costs, "slots": num_slots}) + "\n" for costs in requests)
    status, peak, stderr, lines = _peak_rss(stdin, [sys.executable, "-m", "mimo_pipes.cli.main", "balance"])
    assert status == 0, stderr
    assert peak < GIB, f"peak RSS {peak / GIB:.2f} GiB"
    assert len(lines) == len(requests)
    for line in lines:
        slots = json.loads(line)["slots"]
        assert sorted(i for slot in slots for i in slot) == list(range(size))
        assert {len(slot) for slot in slots} == {size // num_slots}
    assert json.loads(lines[0])["slots"] == balance_microbatch(requests[0], num_slots)


def test_window_with_large_slots_stays_exact():
    # Few slots, many samples each: the searches run slot by slot and 2-2 swaps beyond MAX_PAIRS are skipped.
    rng = random.Random(3)
    rows = [[rng.choice([0, 10**12, rng.randint(0, 10**9)]) for _ in range(3000)] for _ in range(2)]
    result = balance_window(rows, 2, across_microbatches=True)
    flat = sorted(i for microbatch in result for slot in microbatch for i in slot)
    assert flat == list(range(6000))


def _traced_peak(count: int, size: int, num_slots: int, floor: int) -> int:
    """Peak bytes that Python and numpy allocate while one window is planned across micro-batches."""
    import tracemalloc

    rng = random.Random(5)
    rows = [
        [rng.choice([0, 0, rng.randint(1, 10**6), int(10**6 * rng.paretovariate(1.2))]) for _ in range(size)]
        for _ in range(count)
    ]
    tracemalloc.start()
    try:
        balance_window(rows, num_slots, across_microbatches=True, floor=floor)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_window_planning_memory_is_linear_in_the_samples():
    # Four times the samples, grown three ways: more micro-batches (with a floor, which adds a composition
    # per micro-batch), more samples per slot (more compositions with fillers), more slots (the crowded-slot
    # bound's table grows with G squared). Linear memory grows about 4x; scoring every composition at once
    # grew 6-9x on these, and more the larger the window.
    for small, large in [
        ((8, 1024, 256, 10**6), (32, 1024, 256, 10**6)),
        ((16, 256, 64, 0), (16, 1024, 64, 0)),
        ((8, 1024, 256, 0), (8, 4096, 1024, 0)),
    ]:
        assert small[0] * small[1] * 4 == large[0] * large[1]
        ratio = _traced_peak(*large) / _traced_peak(*small)
        assert ratio <= 5, f"{small} -> {large}: peak grew {ratio:.1f}x for 4x the samples"


def test_out_of_memory_is_one_line_and_exit_2(monkeypatch):
    import io

    from mimo_pipes.cli.commands import balance_cmd

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.45 GiB for an array")  # numpy's _ArrayMemoryError is one

    monkeypatch.setattr(balance_cmd, "balance_window", exhausted)
    good = json.dumps({"costs": [1, 2], "slots": 2})
    bad = json.dumps({"costs": [[1, 2], [3, 4]], "slots": 2, "across_microbatches": True})
    stdout, stderr = io.StringIO(), io.StringIO()
    status = balance_cmd.serve(io.BytesIO(f"{good}\n{bad}\n{good}\n".encode()), stdout, stderr)
    assert status == 2
    assert stdout.getvalue().count("\n") == 1  # the line before it stays answered
    assert stderr.getvalue().count("\n") == 1
    assert stderr.getvalue().startswith("mimo-pipes balance: line 2: out of memory")


def test_one_large_microbatch_over_few_slots_stays_small():
    # Few slots of many samples each: the swap search computes the moves of the slots it looks at, a few at a
    # time; a table of every sample's moves (2B x 8 int64, plus the round's (slots, B/G, 8) arrays) traced
    # about 1 KB a sample here.
    import tracemalloc

    rng, size = np.random.default_rng(2), 200_000
    for num_slots in (2, 8):
        # A third each free, uniform up to 10**6, Pareto(1.2) from 10**5; drawn by numpy (drawing them one by one
        # in Python took about 0.25 of its 3.4 CPU-s).
        kind, uniform = rng.integers(0, 3, size), rng.integers(1, 10**6, size, endpoint=True)
        costs = np.select([kind == 0, kind == 1], [0, uniform], (10**5 * (rng.pareto(1.2, size) + 1)).astype(np.int64)).tolist()
        tracemalloc.start()
        try:
            slots = balance_microbatch(costs, num_slots)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert sorted(i for slot in slots for i in slot) == list(range(len(costs)))
        assert peak / len(costs) < 700, f"G={num_slots}: {peak / len(costs):.0f} bytes per sample"


def test_window_planning_work_is_linear_in_the_samples(monkeypatch):
    # The compositions scored grow at most logarithmically with B/G and W: a window of many samples per slot
    # (B/G = 3,125 filler counts before the bound) and one of many micro-batches with a floor (198 hybrid
    # compositions before thinning) score about a hundred each (109 and 80); scored without thinning, 3,129
    # and 218. 200 micro-batches, not 400, keep that margin at half the planning.
    from mimo_pipes.balance.window import planner as window_planner

    scored = []
    original = window_planner.estimate
    monkeypatch.setattr(window_planner, "estimate", lambda *args: scored.append(1) or original(*args))
    rng = random.Random(4)
    for count, size, num_slots, floor in [(2, 12_500, 4, 0), (200, 64, 4, 10**5)]:
        scored.clear()
        rows = [[rng.choice([0, rng.randint(1, 10**6)]) for _ in range(size)] for _ in range(count)]
        result = balance_window(rows, num_slots, across_microbatches=True, floor=floor)
        assert sorted(i for micro in result for slot in micro for i in slot) == list(range(count * size))
        assert len(scored) <= 150, f"{count} x {size} over {num_slots}: {len(scored)} compositions scored"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10**7), unique=True, max_size=3000).map(sorted))
def test_thinned_compositions_keep_the_dense_start_and_the_end(values):
    from mimo_pipes.balance.window.compositions import thinned
    from mimo_pipes.balance.window.tuning import TUNING

    COMPOSITIONS_DENSE, COMPOSITIONS_GROWTH = TUNING.compositions_dense, TUNING.compositions_growth
    kept = thinned(list(values), TUNING)
    assert set(kept) <= set(values) and kept == sorted(kept)
    if len(values) <= COMPOSITIONS_DENSE:
        assert kept == values
        return
    assert kept[:COMPOSITIONS_DENSE] == values[:COMPOSITIONS_DENSE] and kept[-1] == values[-1]
    # Past the dense start each kept value is at least 1/16 above the one before (the last excepted), so
    # their number grows with the log of the largest.
    for before, after in zip(kept[COMPOSITIONS_DENSE - 1 : -2], kept[COMPOSITIONS_DENSE:-1]):
        assert after * COMPOSITIONS_GROWTH >= before * (COMPOSITIONS_GROWTH + 1)
    assert len(kept) <= COMPOSITIONS_DENSE + 2 + 17.5 * np.log(values[-1])
