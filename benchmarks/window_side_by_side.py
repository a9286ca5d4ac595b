"""The across-micro-batch planner under two tunings side by side on the windows of the other window benchmarks
(docs/benchmarks.md, "Mixed text-and-image windows"): each window planned both ways in turn in one process,
CPU time of one ``balance_window`` call, and how many plans each way is lower.

Families: ``exact`` (120 windows of at most 16 samples from ``window_generated.py``'s generator, seed 11),
``few`` (``window_few_costs.py``'s kinds, 12 seeds each), ``generated`` (``window_generated.py``'s 160
windows, seed 7), ``best`` (``balance.py``'s windows against the best known of at most 512 samples, seed 3,
one of each mix and floor) and ``quality`` (``balance.py``'s windows of 8 micro-batches for every G and B/G,
one of each mix, seed 1).

    python benchmarks/window_side_by_side.py [--families exact few generated best quality] [--tuning FIELD=INT ...]

``--tuning`` sets fields of the second tuning; the first is the default with ``levels_max_samples`` 0 (the
planner without its search over levels) unless ``--base FIELD=INT ...`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

from mimo_pipes.balance import balance_window  # noqa: E402
from mimo_pipes.balance.window.tuning import TUNING, WindowTuning  # noqa: E402


def family(name: str) -> list[tuple[list[list[int]], int, int]]:
    """(costs, G, floor) of every window of one family."""
    if name in ("exact", "generated"):
        import window_generated

        rng = np.random.default_rng(11 if name == "exact" else 7)
        windows = []
        while len(windows) < (120 if name == "exact" else 160):
            costs, slots, floor, _ = window_generated.draw_window(rng)
            if name == "generated" or len(costs) * len(costs[0]) <= 16:
                windows.append((costs, slots, floor))
        return windows
    if name == "few":
        import window_few_costs

        return [window_few_costs.draw(kind, 1000 * (number + 1) + seed)
                for number, kind in enumerate(window_few_costs.KINDS.values()) for seed in range(12)]
    import balance

    if name == "best":
        rng = np.random.default_rng(3)
        mixes = list(balance.WINDOW_MIXES) + ["bimodal", "general", "text+photos", "docs+charts"]
        windows = []
        for count, slots, per_slot in balance.WINDOW_SHAPES:
            if count * slots * per_slot <= 512:
                for mix in mixes:
                    for share in (0.0, 0.8):
                        costs = [balance.draw_costs(rng, mix, slots * per_slot).tolist() for _ in range(count)]
                        windows.append((costs, slots, int(sum(map(sum, costs)) / (count * slots) * share)))
        return windows
    rng = np.random.default_rng(1)
    return [(np.stack([balance.draw_costs(rng, mix, slots * per_slot) for _ in range(8)]).tolist(), slots, 0)
            for slots in balance.GROUPS for per_slot in (1, 2, 4, 8) for mix in balance.MIXES]


def _planned(costs: list[list[int]], slots: int, floor: int, tuning: WindowTuning) -> tuple[int, float]:
    started = time.process_time_ns()
    plan = balance_window(costs, slots, True, floor=floor, tuning=tuning)
    ms = (time.process_time_ns() - started) / 1e6
    flat = [c for row in costs for c in row]
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots_)) for slots_ in plan), ms


def _tuning(base: WindowTuning, pairs: list[str]) -> WindowTuning:
    fields = {}
    for pair in pairs:
        name, value = pair.split("=")
        fields[name] = type(getattr(TUNING, name))(int(value))
    return replace(base, **fields)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["exact", "few", "generated", "best", "quality"])
    parser.add_argument("--base", nargs="*", default=["levels_max_samples=0"])
    parser.add_argument("--tuning", nargs="*", default=[])
    args = parser.parse_args()
    first, second = _tuning(TUNING, args.base), _tuning(TUNING, args.tuning)
    print("| windows | median ms: first / second | p90 ms: first / second | second lower / higher |")
    print("|---|---:|---:|---:|")
    for name in args.families:
        rows = [(_planned(c, g, f, first), _planned(c, g, f, second)) for c, g, f in family(name)]
        times = [sorted(row[side][1] for row in rows) for side in (0, 1)]
        p90 = [t[int(0.9 * (len(t) - 1))] for t in times]
        lower = sum(b[0] < a[0] for a, b in rows)
        higher = sum(b[0] > a[0] for a, b in rows)
        print(f"| {name}: {len(rows)} | {statistics.median(times[0]):.2f} / {statistics.median(times[1]):.2f} | "
              f"{p90[0]:.1f} / {p90[1]:.1f} | {lower} / {higher} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
