"""CPU time of the window planner's inner searches on seeded random cases (the same cases every run).

Three searches, each on its own seeded set: the repair toward level caps (``level_repair.repair``; windows of
2-8 micro-batches of 4-16 slots of 2-3 samples, caps up to 40% under a random plan's loads), the exact search
for a micro-batch's heaviest slot (``exact.search_slots``; 2-8 slots of 1-8 samples, budgets of 50 to 20,000
placements) and the branch and bound over a window's samples (``window_search.search_window``; 1-5
micro-batches of 2-6 bins of 1-4 samples, budgets of 50 to 30,000 placements). Costs: a few resolutions with
text-only zeros, or a long tail. Each set prints its process CPU time and a digest of every answer, so two
versions of the code can be compared on the figure and checked to answer exactly alike::

    python benchmarks/search_cost.py                      # this checkout
    PYTHONPATH=OTHER_CHECKOUT python benchmarks/search_cost.py   # another version, same cases
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator

import numpy as np

from mimo_pipes.balance.quality import sorted_lower_bound, window_path_bound
from mimo_pipes.balance.search.exact import search_slots
from mimo_pipes.balance.search.window_search import search_window
from mimo_pipes.balance.window.level_repair import Passed, repair, sorted_path
from mimo_pipes.balance.window.tuning import TUNING


def _costs(rng: np.random.Generator, size: int) -> np.ndarray:
    if rng.random() < 0.5:
        return rng.choice(rng.choice([0, 64, 144, 256, 576, 1024], size=int(rng.integers(1, 5))), size=size).astype(np.int64)
    return (rng.pareto(1.2, size) * 300).astype(np.int64)


def repairs(cases: int) -> Iterator[Callable[[], object]]:
    rng = np.random.default_rng(0)
    for _ in range(cases):
        count, num_slots, per_slot = int(rng.integers(2, 9)), int(rng.integers(4, 17)), int(rng.integers(2, 4))
        flat = _costs(rng, count * num_slots * per_slot)
        floor = int(rng.choice([0, flat.sum() // (count * num_slots) // 2]))
        members = rng.permutation(flat.shape[0]).astype(np.int64).reshape(-1, per_slot)
        loads = np.sort(flat[members].sum(axis=1))[::-1]
        caps = np.sort((loads * rng.uniform(0.6, 1.0) + rng.integers(0, 50, loads.shape[0])).astype(np.int64))[::-1].copy()
        passed = Passed(sorted_path(loads, num_slots, floor), members)

        def one(flat=flat, members=members, caps=caps, num_slots=num_slots, floor=floor, passed=passed):
            reached = repair(flat, members, caps, num_slots, floor, passed, TUNING)
            return None if reached is None else reached.tolist(), passed.path, passed.work

        yield one


def exact_searches(cases: int) -> Iterator[Callable[[], object]]:
    rng = np.random.default_rng(1)
    for _ in range(cases):
        num_slots, per_slot = int(rng.integers(2, 9)), int(rng.integers(1, 9))
        ordered = np.sort(_costs(rng, num_slots * per_slot))[::-1]
        costs, lower = ordered.tolist(), sorted_lower_bound(ordered, num_slots)
        incumbent = None if rng.random() < 0.3 else int(sum(costs) // num_slots + rng.integers(0, 2000))
        limit = int(rng.choice([50, 500, 20_000]))
        yield lambda costs=costs, num_slots=num_slots, incumbent=incumbent, lower=lower, limit=limit: search_slots(
            list(costs), num_slots, incumbent, lower, limit
        )


def window_searches(cases: int) -> Iterator[Callable[[], object]]:
    rng = np.random.default_rng(2)
    for _ in range(cases):
        count, num_slots, per_bin = int(rng.integers(1, 6)), int(rng.integers(2, 7)), int(rng.integers(1, 5))
        ordered = np.sort(_costs(rng, count * num_slots * per_bin))[::-1]
        floor = int(rng.choice([0, ordered.sum() // (count * num_slots) // 2]))
        lower = int(window_path_bound(ordered, count, num_slots, floor))
        incumbent, limit = int(lower + rng.integers(1, 3000)), int(rng.choice([50, 1000, 30_000]))
        costs = ordered.tolist()
        yield lambda costs=costs, count=count, num_slots=num_slots, floor=floor, incumbent=incumbent, lower=lower, limit=limit: (
            search_window(list(costs), count, num_slots, floor, incumbent, lower, limit)
        )


def timed(cases: Iterator[Callable[[], object]]) -> tuple[float, str]:
    """(CPU seconds of the calls alone, digest of their answers)."""
    digest = hashlib.sha256()
    spent = 0.0
    for call in cases:
        start = time.process_time()
        answer = call()
        spent += time.process_time() - start
        digest.update(repr(answer).encode())
    return spent, digest.hexdigest()[:16]


def main() -> int:
    for name, cases in (("repair", repairs(1500)), ("exact", exact_searches(4000)), ("window", window_searches(1500))):
        spent, digest = timed(cases)
        print(f"{name}: {spent:.2f} CPU-s, answers {digest}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
