"""How far the across-micro-batch plan sits above ``window_lower_bound``, with the bound's first two families only
(average, largest samples: the bound before heads-and-rest and stacked samples) and with all four, on windows of
different shapes and cost distributions (one window each, fixed seed). A ratio that falls from one to the other is
the bound's looseness, not the plan's; the plan is the same. Also the CPU time of the plan and of the bound.

    python benchmarks/window_bound_ratios.py [--cases KIND:W:B:G ...]

KIND: ``thirds`` (a third 0, a third 10^12, a third uniform below: ``balance_memory.py``'s costs), ``paretoA``
(Pareto of shape A times 1000; ``pareto`` is 1.2), ``bimodal`` (half 50-149, half 5000-5999), ``equal`` (0, 256 or
1024), ``hugeN`` (0-99 and N samples of 10^7), ``mix=NAME`` (``balance.py``'s mixes, ``_`` for spaces).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

from mimo_pipes.balance import balance_window, critical_path, window_lower_bound  # noqa: E402

CASES = ["thirds:100:10048:64", "pareto:100:10048:64", "pareto0.8:100:10048:64", "huge10:100:10048:64", "huge100:100:10048:64",
         "huge3000:100:10048:64", "mix=long_tail:100:10048:64", "mix=many_images_+_text:100:10048:64", "pareto:25:4096:32",
         "huge50:25:4096:32", "pareto:8:512:64", "bimodal:8:512:64", "equal:8:512:64", "pareto:1000:1000:8", "huge1500:1000:1000:8",
         "pareto:10:100000:100", "huge150:10:100000:100"]


def costs_of(kind: str, count: int, size: int, seed: int = 0) -> list[list[int]]:
    rng, n = np.random.default_rng(seed), count * size
    if kind == "thirds":
        draw, heavy = random.Random(seed), 10**12
        return [[draw.choice((0, heavy, draw.randint(0, heavy))) for _ in range(size)] for _ in range(count)]
    if kind.startswith("mix="):
        import balance

        flat = balance.draw_costs(rng, kind[4:].replace("_", " "), n).astype(np.int64)
    elif kind.startswith("pareto"):
        flat = (rng.pareto(float(kind[6:] or 1.2), n) * 1000).astype(np.int64)
    elif kind == "bimodal":
        flat = np.where(rng.random(n) < 0.5, rng.integers(50, 150, n), rng.integers(5000, 6000, n))
    elif kind == "equal":
        flat = rng.choice([0, 256, 1024], n)
    elif kind.startswith("huge"):
        flat = rng.integers(0, 100, n)
        flat[rng.choice(n, int(kind[4:]), replace=False)] = 10**7
    else:
        raise SystemExit(f"unknown costs {kind!r}")
    return flat.reshape(count, size).tolist()


def first_two_families(costs: list[list[int]], num_slots: int) -> int:
    """The bound as it was: the larger of the average and the largest samples."""
    window = np.asarray(costs, dtype=np.int64)
    count, size = window.shape
    flat = np.sort(window.reshape(-1))[::-1]
    per_slot = size // num_slots
    lightest = int(flat[flat.shape[0] - (per_slot - 1):].sum()) if per_slot > 1 else 0
    return max(-(-int(flat.sum()) // num_slots), int(flat[::size][:count].sum()) + count * lightest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=CASES)
    args = parser.parse_args()
    print("| window (W x B over G) | costs | plan / two families | plan / all four | plan CPU s | bound CPU s |")
    print("|---|---|---:|---:|---:|---:|")
    for case in args.cases:
        kind, count, size, slots = case.split(":")
        count, size, slots = int(count), int(size), int(slots)
        costs = costs_of(kind, count, size)
        started = time.process_time()
        path = critical_path(costs, balance_window(costs, slots, across_microbatches=True))
        planned = time.process_time() - started
        started = time.process_time()
        bound = window_lower_bound(costs, slots)
        bounded = time.process_time() - started
        print(f"| {count} x {size:,} over {slots} | {kind} | {path / first_two_families(costs, slots):.4f} | {path / bound:.4f} "
              f"| {planned:.2f} | {bounded:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
