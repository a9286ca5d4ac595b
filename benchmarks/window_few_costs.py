"""The across-micro-batch planner on windows of few distinct costs (text-only zeros, images on a few
resolutions) against their proven optima (docs/benchmarks.md, "Windows of few distinct costs").

Kinds: the reported one (4 micro-batches of 16 samples over 8 slots, about 60% text-only, images of 256,
576 and 1024 tokens) and neighbours: other text shares and resolutions, other W, B and G (2 to 4 samples
per slot), floors, two windows of more than 64 samples, and random shapes of at most 64 samples. The reference is the optimum the count search (``count_search``) proves with a large
budget from the planner's plan; where it does not finish, the best of it and the branch and bounds over
samples (``bin_search``, ``window_search``) with 50,000 placements each. Planner time is the CPU time of
one ``balance_window`` call.

    python benchmarks/window_few_costs.py [--windows 100] [--first-seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mimo_pipes.balance import balance_window  # noqa: E402
from mimo_pipes.balance.quality import window_path_bound  # noqa: E402
from mimo_pipes.balance.search.bin_search import search_bins  # noqa: E402
from mimo_pipes.balance.search.window_search import search_window  # noqa: E402
from mimo_pipes.balance.window.tuning import TUNING  # noqa: E402

REFERENCE_NODES = 50_000
COUNT_REFERENCE_WORK = 10**9

# name -> W, B, G, text-only share, resolutions, floor as a fraction of the mean slot load
KINDS = {
    "4 x 16 / 8, 60%, 256/576/1024 (the reported kind)": (4, 16, 8, 0.6, (256, 576, 1024), 0.0),
    "4 x 16 / 8, 50%, 144/576/1600": (4, 16, 8, 0.5, (144, 576, 1600), 0.0),
    "4 x 16 / 8, 70%, 256/1024": (4, 16, 8, 0.7, (256, 1024), 0.0),
    "2 x 32 / 8, 60%, 256/576/1024": (2, 32, 8, 0.6, (256, 576, 1024), 0.0),
    "4 x 16 / 4, 60%, 64/256/1024/4096": (4, 16, 4, 0.6, (64, 256, 1024, 4096), 0.0),
    "4 x 16 / 8, 60%, 256/576/1024, floor 0.8": (4, 16, 8, 0.6, (256, 576, 1024), 0.8),
    "3 x 16 / 8, 40%, 256/576/1024/2304": (3, 16, 8, 0.4, (256, 576, 1024, 2304), 0.0),
    "5 x 8 / 4, 60%, 256/576/1024": (5, 8, 4, 0.6, (256, 576, 1024), 0.0),
    "4 x 12 / 4, 30%, 576/1024/1600, floor 0.5": (4, 12, 4, 0.3, (576, 1024, 1600), 0.5),
    "8 x 8 / 4, 60%, 144/256/576/1024": (8, 8, 4, 0.6, (144, 256, 576, 1024), 0.0),
    "2 x 24 / 8, 50%, 256/1024/4096, floor 0.5": (2, 24, 8, 0.5, (256, 1024, 4096), 0.5),
    "8 x 16 / 8 (128 samples), 60%, 256/576/1024": (8, 16, 8, 0.6, (256, 576, 1024), 0.0),
    "6 x 20 / 5 (120 samples), 50%, 144/576/2304, floor 0.8": (6, 20, 5, 0.5, (144, 576, 2304), 0.8),
}


RESOLUTIONS = (64, 144, 256, 576, 1024, 1600, 2304, 4096)
RANDOM = "random: W 1-8, G 1-16, k 2-4, at most 64 samples, 0-80%, 1-7 resolutions, floor 0/0.5/0.8"  # W 1-8, G 1-16, k 2-4, at most 64 samples, any text share and floor
KINDS[RANDOM] = None


def draw(kind: tuple | None, seed: int) -> tuple[list[list[int]], int, int]:
    """(costs per micro-batch, G, floor) of one window of ``kind`` (None: a random shape)."""
    rng = np.random.default_rng(seed)
    if kind is None:
        while True:
            count, slots, per_slot = int(rng.integers(1, 9)), int(rng.integers(1, 17)), int(rng.integers(2, 5))
            if count * slots * per_slot <= 64:
                break
        resolutions = tuple(rng.choice(RESOLUTIONS, size=int(rng.integers(1, 8)), replace=False).tolist())
        text, floor_share = float(rng.uniform(0, 0.8)), float(rng.choice([0.0, 0.0, 0.5, 0.8]))
        kind = (count, slots * per_slot, slots, text, resolutions, floor_share)
    count, size, slots, text, resolutions, floor_share = kind
    image = rng.choice(resolutions, size=(count, size))
    costs = np.where(rng.random((count, size)) < text, 0, image).astype(np.int64)
    floor = int(costs.sum() / (count * slots) * floor_share)
    return costs.tolist(), slots, floor


def path_of(flat: list[int], plan, floor: int) -> int:
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)


def reference(costs: list[list[int]], slots: int, floor: int, known: int) -> tuple[int, bool]:
    """(best critical path known, proven optimal)."""
    count = len(costs)
    flat = sorted((c for row in costs for c in row), reverse=True)
    lower = window_path_bound(np.asarray(flat, dtype=np.int64), count, slots, floor)
    try:
        from mimo_pipes.balance.search.count_search import search_counts
    except ImportError:  # a checkout from before the count search
        search_counts = None
    best = known
    if search_counts is not None:
        exact = search_counts(flat, count, slots, floor, known, lower, COUNT_REFERENCE_WORK)
        if exact.proven:
            return exact.best, True
        best = exact.best
    first = search_bins(flat, count, slots, floor, best, lower, REFERENCE_NODES)
    second = search_window(flat, count, slots, floor, first.best, lower, REFERENCE_NODES)
    return min(first.best, second.best), first.proven or second.proven


def planned(costs: list[list[int]], slots: int, floor: int, count_work: int | None) -> tuple[int, float]:
    """(critical path, CPU ms) of the planner, with the count search's budget set to ``count_work`` (0: off,
    the planner as it was before it; None: as shipped)."""
    tuning = TUNING if count_work is None else replace(TUNING, count_work=count_work)
    start = time.process_time()
    plan = balance_window(costs, slots, across_microbatches=True, floor=floor, tuning=tuning)
    elapsed = (time.process_time() - start) * 1e3
    return path_of([c for row in costs for c in row], plan, floor), elapsed


def summary(gaps: list[float], times: list[float]) -> dict:
    return {
        "above_1pct": sum(g > 1 for g in gaps),
        "mean_gap": statistics.fmean(gaps),
        "worst_gap": max(gaps),
        "median_ms": statistics.median(times),
        "max_ms": max(times),
    }


def evaluate(windows: int, first_seed: int) -> dict:
    """Per kind: the planner without the count search ("before") and with it ("after"), against one reference."""
    rows = {}
    for number, (name, kind) in enumerate(KINDS.items()):
        results = {"before": ([], []), "after": ([], [])}
        proven = 0
        for seed in range(first_seed, first_seed + windows):
            costs, slots, floor = draw(kind, 1000 * (number + 1) + seed)
            before = planned(costs, slots, floor, 0)
            after = planned(costs, slots, floor, None)
            best, exact = reference(costs, slots, floor, min(before[0], after[0]))
            proven += exact
            for label, (path, ms) in (("before", before), ("after", after)):
                results[label][0].append((path - best) / best * 100 if best else 0.0)
                results[label][1].append(ms)
        rows[name] = {"windows": windows, "proven": proven}
        for label, (gaps, times) in results.items():
            rows[name][label] = summary(gaps, times)
        print(name, json.dumps(rows[name], default=lambda x: round(x, 3)), flush=True)
    return rows


def render(rows: dict) -> list[str]:
    """The markdown table of docs/benchmarks.md, "Windows of few distinct costs"."""
    lines = [
        "| kind (W x B / G, text-only share, resolutions, floor) | windows (proven) | without the search over counts: "
        "more than 1% above / worst % / ms median, max | with it: more than 1% above / worst % / ms median, max |",
        "|---|---:|---:|---:|",
    ]
    for name, row in rows.items():
        before, after = row["before"], row["after"]
        lines.append(
            f"| {name} | {row['windows']} ({row['proven']}) | {before['above_1pct']} / {before['worst_gap']:.2f} / "
            f"{before['median_ms']:.1f}, {before['max_ms']:.1f} | **{after['above_1pct']} / {after['worst_gap']:.2f}** / "
            f"{after['median_ms']:.1f}, {after['max_ms']:.1f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=100, help="windows per kind")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    started = time.time()
    rows = evaluate(args.windows, args.first_seed)
    print(f"{time.time() - started:.0f} s")
    print("\n".join(render(rows)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
