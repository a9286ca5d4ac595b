"""The across-micro-batch planner on many generated windows of varied shapes against exact optima or the
best plans known (docs/benchmarks.md, "Generated windows"; balance.py's own windows are in "Balancing").

Shapes: W from 2 to 8 micro-batches, G from 2 to 16 slots, 1 to 4 samples per slot, at most 128 samples.
Costs: a text-only share from 0 to 80% (cost 0), the rest heavy-tailed image costs, either free (Pareto
token counts) or on a few resolutions (many equal costs), each window with floor 0 or a floor of 0.8x the
mean slot load. The reference is the exact optimum where it is proven (every partition for at most 16
samples; otherwise the search over counts of ``count_search`` where the window has at most 8 distinct costs,
and the branch and bounds of ``bin_search`` and ``window_search``, each with a large budget from the
planner's plan), else the best plan those searches found. ``--count-work 0`` runs the planner without its
search over counts (as it was before it), on the same windows and references.

    python benchmarks/window_generated.py [--windows 160] [--seed 7] [--count-work N] [--tuning FIELD=INT ...]
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
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


from mimo_pipes.balance import balance_window  # noqa: E402
from mimo_pipes.balance.quality import window_path_bound  # noqa: E402
from mimo_pipes.balance.search.bin_search import search_bins  # noqa: E402
from mimo_pipes.balance.search.window_search import search_window  # noqa: E402
from mimo_pipes.balance.window.tuning import TUNING, WindowTuning  # noqa: E402

REFERENCE_NODES = 50_000  # per search over samples
COUNT_REFERENCE_WORK = 200_000_000  # the search over counts (about 20 s at most)
MAX_SAMPLES = 128
RESOLUTIONS = (64, 144, 256, 576, 1024, 1600, 2304, 4096)  # image tokens of common fixed sizes


def draw_window(rng: np.random.Generator) -> tuple[list[list[int]], int, int, dict]:
    """(costs per micro-batch, G, floor, description) of one generated window."""
    while True:
        count, slots, per_slot = int(rng.integers(2, 9)), int(rng.integers(2, 17)), int(rng.integers(1, 5))
        if count * slots * per_slot <= MAX_SAMPLES:
            break
    size = slots * per_slot
    text = float(rng.uniform(0.0, 0.8))
    kind = "resolutions" if rng.random() < 0.5 else "pareto"
    if kind == "resolutions":
        values = rng.choice(RESOLUTIONS, size=int(rng.integers(2, 6)), replace=False)
        image = rng.choice(values, size=(count, size))
    else:
        image = np.minimum((rng.pareto(1.2, size=(count, size)) + 1) * 200, 16_384).astype(np.int64)
    costs = np.where(rng.random((count, size)) < text, 0, image).astype(np.int64)
    floor = int(costs.sum() / (count * slots) * 0.8) if rng.random() < 0.5 else 0
    return costs.tolist(), slots, floor, {"W": count, "G": slots, "k": per_slot, "text": text, "kind": kind}


def path_of(flat: list[int], plan, floor: int) -> int:
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)


def reference(costs: list[list[int]], slots: int, floor: int, known: int) -> tuple[int, bool]:
    """(best critical path known, proven optimal)."""
    from window_exact import MAX_SAMPLES as EXACT_MAX
    from window_exact import exact_window_path

    count = len(costs)
    flat = sorted((c for row in costs for c in row), reverse=True)
    if len(flat) <= EXACT_MAX:
        return exact_window_path(costs, slots, floor), True
    lower = window_path_bound(np.asarray(flat, dtype=np.int64), count, slots, floor)
    if known <= lower or len(flat) // (count * slots) < 2:
        return known, known <= lower or len(flat) == count * slots
    if len(set(flat)) <= 8:
        from mimo_pipes.balance.search.count_search import search_counts

        counted = search_counts(flat, count, slots, floor, known, lower, COUNT_REFERENCE_WORK)
        if counted.proven:
            return counted.best, True
        known = counted.best
    first = search_bins(flat, count, slots, floor, known, lower, REFERENCE_NODES)
    second = search_window(flat, count, slots, floor, first.best, lower, REFERENCE_NODES)
    return min(first.best, second.best), first.proven or second.proven


def evaluate(windows: int, seed: int, progress=None, tuning: WindowTuning = TUNING) -> dict:
    rng = np.random.default_rng(seed)
    gaps, ms, proven, rows = [], [], 0, []
    for number in range(windows):
        costs, slots, floor, info = draw_window(rng)
        flat = [c for row in costs for c in row]
        started = time.process_time_ns()
        plan = balance_window(costs, slots, True, floor=floor, tuning=tuning)
        ms.append((time.process_time_ns() - started) / 1e6)
        path = path_of(flat, plan, floor)
        best, exact = reference(costs, slots, floor, path)
        gaps.append(path / max(best, 1) - 1)
        proven += exact
        rows.append({**info, "floor": floor, "path": path, "best": best, "proven": exact})
        if progress is not None and (number + 1) % 20 == 0:
            progress(f"  generated windows: {number + 1}/{windows}")
    small = [g for g, row in zip(gaps, rows) if row["W"] * row["G"] * row["k"] <= 64]
    return {"windows": windows, "gaps": gaps, "small": small, "proven": proven, "ms": ms, "rows": rows}


def render(result: dict, seed: int) -> list[str]:
    gaps, small, ms = result["gaps"], result["small"], result["ms"]
    over = sum(g > 0.01 for g in gaps)
    return [
        f"{result['windows']} windows (seed {seed}; W 2-8, G 2-16, 1-4 samples per slot, at most {MAX_SAMPLES} samples, "
        "0-80% text-only, Pareto or few-resolution image costs, floor 0 or 0.8x the mean slot load); "
        f"{result['proven']} proven optimal.",
        "",
        "| windows | this planner: % above best known, average / worst | more than 1% above | windows of at most 64 samples, average / worst | planner ms, median / max |",
        "|---:|---:|---:|---:|---:|",
        f"| {len(gaps)} | **{100 * statistics.fmean(gaps):.3f} / {100 * max(gaps):.2f}** | {over} | "
        f"{100 * statistics.fmean(small):.3f} / {100 * max(small):.2f} ({len(small)}) | "
        f"{statistics.median(ms):.1f} / {max(ms):.1f} |",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=160)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count-work", type=int, help="the planner's budget for its search over counts (0: off)")
    parser.add_argument("--tuning", action="append", default=[], metavar="FIELD=INT",
                        help="another value of a WindowTuning field, e.g. pairs_after_exact=0 (repeatable)")
    args = parser.parse_args()
    tuning = TUNING if args.count_work is None else replace(TUNING, count_work=args.count_work)
    for setting in args.tuning:
        field, _, value = setting.partition("=")
        kind = type(getattr(TUNING, field))
        tuning = replace(tuning, **{field: kind(int(value))})
    result = evaluate(args.windows, args.seed, progress=lambda m: print(m, file=sys.stderr, flush=True), tuning=tuning)
    print("\n".join(render(result, args.seed)))
    worst = sorted(zip(result["gaps"], result["rows"]), key=lambda item: -item[0])[:5]
    for gap, row in worst:
        print(f"  {100 * gap:.2f}%: {row}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
